//! A `redis-server` started by a test or an example: Debian's package, on a port of its
//! own, without persistence; `ADMISSION_REDIS_SERVER` names another binary (a
//! `valkey-server`). (The examples include this file by path.)

use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A `redis-server` of the test's own, on a port of its own, without persistence.
pub struct Redis {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
}

impl Redis {
    /// Starts one; `None` (the test is skipped, and says so) where `redis-server` is not
    /// installed, unless `ADMISSION_REDIS_REQUIRED` is set (as CI sets it): then a panic.
    pub fn start(test: &str) -> Option<Self> {
        let found = Command::new(binary())
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if !found {
            assert!(
                std::env::var_os("ADMISSION_REDIS_REQUIRED").is_none(),
                "redis-server is required (ADMISSION_REDIS_REQUIRED) and not installed"
            );
            eprintln!("{test}: SKIPPED, no redis-server on this machine");
            return None;
        }
        let port = StdListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let dir =
            std::env::temp_dir().join(format!("admission-redis-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("a directory for redis");
        let mut redis = Self {
            child: None,
            port,
            dir,
        };
        redis.restart();
        Some(redis)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("a client")
    }

    /// Kills it (SIGKILL: nothing saved, nothing said to its clients).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port, empty, and waits until it answers.
    pub fn restart(&mut self) {
        self.stop();
        let child = Command::new(binary())
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            // For `DEBUG SLEEP`: a Redis that is slow rather than gone.
            .args(["--enable-debug-command", "yes"])
            .arg("--dir")
            .arg(&self.dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.child = Some(child);
        let client = self.client();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ping = client
                .get_connection_with_timeout(Duration::from_millis(200))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if ping.is_ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "redis-server answers within 10 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The server binary: `ADMISSION_REDIS_SERVER`, or `redis-server`.
pub fn binary() -> std::ffi::OsString {
    std::env::var_os("ADMISSION_REDIS_SERVER").unwrap_or_else(|| "redis-server".into())
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
