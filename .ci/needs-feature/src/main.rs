#[tokio::main(flavor = "current_thread")]
async fn main() {
    let layer = admission_tower::AdmissionLayer::builder().count(4).build().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let _ = layer.guard(listener);
    // As the README writes it: the one error is the feature's, not one about the result.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let shutdown = layer
        .serve(listener, ())
        .with_graceful_shutdown(async {}, std::time::Duration::from_secs(1))
        .await;
    println!("{} connections cut", shutdown.connections_cut());
}
