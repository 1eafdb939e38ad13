#[tokio::main(flavor = "current_thread")]
async fn main() {
    let layer = admission_tower::AdmissionLayer::builder().count(4).build().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let _ = layer.guard(listener);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let _ = layer.serve(listener, ());
}
