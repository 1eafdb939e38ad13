//! Redis as production runs it, started by a test: a three-primary Cluster
//! (`--cluster-enabled yes`, joined by `redis-cli --cluster create`), and a primary with a
//! replica watched by three Sentinels (`redis-server --sentinel`). Each process on a port
//! of its own, without persistence, killed when dropped.

use std::net::TcpListener as StdListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::redis_server::binary;

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// Whether the tools are here; if not, the test is skipped (and says so), unless
/// `ADMISSION_REDIS_REQUIRED` is set: then a panic.
fn found(test: &str) -> bool {
    let runs = |program: &std::ffi::OsStr| {
        Command::new(program)
            .arg("--version")
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    };
    if runs(&binary()) && runs("redis-cli".as_ref()) {
        return true;
    }
    assert!(
        std::env::var_os("ADMISSION_REDIS_REQUIRED").is_none(),
        "redis-server and redis-cli are required (ADMISSION_REDIS_REQUIRED)"
    );
    eprintln!("{test}: SKIPPED, no redis-server or redis-cli on this machine");
    false
}

/// Processes of one test, in a directory of its own.
struct Processes {
    dir: PathBuf,
    children: Vec<(u16, Child)>,
}

impl Processes {
    fn new(test: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "admission-redis-{test}-{}-{}",
            std::process::id(),
            free_port()
        ));
        std::fs::create_dir_all(&dir).expect("a directory");
        Self {
            dir,
            children: Vec::new(),
        }
    }

    /// A `redis-server` on a port of its own with `args`, in a directory of its own.
    fn spawn(&mut self, args: &[&str]) -> u16 {
        let port = free_port();
        let dir = self.dir.join(port.to_string());
        std::fs::create_dir_all(&dir).expect("a directory");
        let child = Command::new(binary())
            .args(args)
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server starts");
        self.children.push((port, child));
        port
    }

    /// Kills the process on `port` (SIGKILL).
    fn kill(&mut self, port: u16) {
        if let Some(at) = self.children.iter().position(|(p, _)| *p == port) {
            let (_, mut child) = self.children.remove(at);
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Processes {
    fn drop(&mut self) {
        for (_, child) in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn url(port: u16) -> String {
    format!("redis://127.0.0.1:{port}/")
}

/// Runs `command` on `port` until `done` holds of its answer (at most 20 s).
fn until(port: u16, command: &[&str], done: impl Fn(&str) -> bool) {
    let client = redis::Client::open(url(port)).expect("a client");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let answer = client
            .get_connection_with_timeout(Duration::from_millis(200))
            .and_then(|mut c| {
                let mut cmd = redis::cmd(command[0]);
                for arg in &command[1..] {
                    cmd.arg(*arg);
                }
                cmd.query::<redis::Value>(&mut c)
            });
        if answer.is_ok_and(|answer| done(&format!("{answer:?}"))) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{command:?} on {port} within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Three primaries in a Redis Cluster, no replicas.
pub struct Cluster {
    _processes: Processes,
    pub ports: Vec<u16>,
}

impl Cluster {
    pub fn start(test: &str) -> Option<Self> {
        if !found(test) {
            return None;
        }
        let mut processes = Processes::new(test);
        let ports: Vec<u16> = (0..3)
            .map(|_| {
                processes.spawn(&["--cluster-enabled", "yes", "--cluster-node-timeout", "2000"])
            })
            .collect();
        for &port in &ports {
            until(port, &["PING"], |answer| answer.contains("PONG"));
        }
        let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .expect("redis-cli runs");
        assert!(created.success(), "redis-cli --cluster create");
        for &port in &ports {
            until(port, &["CLUSTER", "INFO"], |info| {
                info.contains("cluster_state:ok")
            });
        }
        Some(Self {
            _processes: processes,
            ports,
        })
    }

    pub fn urls(&self) -> Vec<String> {
        self.ports.iter().map(|&port| url(port)).collect()
    }

    /// The node that holds `key`'s slot: the one that answers for it (the others answer
    /// MOVED).
    pub fn node_of(&self, key: &str) -> u16 {
        let answers = |port: u16| {
            let mut connection = redis::Client::open(url(port))
                .unwrap()
                .get_connection()
                .unwrap();
            redis::cmd("EXISTS")
                .arg(key)
                .query::<u64>(&mut connection)
                .is_ok()
        };
        let owner = self.ports.iter().copied().find(|&port| answers(port));
        owner.expect("a node holds every slot")
    }
}

/// A primary, its replica, and three Sentinels watching them (quorum 2).
pub struct Sentinels {
    processes: Processes,
    pub primary: u16,
    pub replica: u16,
    pub sentinels: Vec<u16>,
}

/// The name the Sentinels know the primary by.
pub const PRIMARY: &str = "fleet";

impl Sentinels {
    pub fn start(test: &str) -> Option<Self> {
        if !found(test) {
            return None;
        }
        let mut processes = Processes::new(test);
        let primary = processes.spawn(&[]);
        until(primary, &["PING"], |answer| answer.contains("PONG"));
        let replica = processes.spawn(&["--replicaof", "127.0.0.1", &primary.to_string()]);
        until(replica, &["INFO", "replication"], |info| {
            info.contains("master_link_status:up")
        });
        let mut sentinels = Vec::new();
        for i in 0..3 {
            let config = processes.dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &config,
                format!(
                    "sentinel monitor {PRIMARY} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {PRIMARY} 500\n\
                     sentinel failover-timeout {PRIMARY} 2000\n\
                     sentinel parallel-syncs {PRIMARY} 1\n"
                ),
            )
            .expect("a sentinel config");
            let config = config.to_str().expect("a path").to_owned();
            let port = free_port();
            let child = Command::new(binary())
                .arg(&config)
                .arg("--sentinel")
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .stdout(Stdio::null())
                .spawn()
                .expect("redis-server --sentinel starts");
            processes.children.push((port, child));
            sentinels.push(port);
        }
        for &port in &sentinels {
            until(port, &["SENTINEL", "REPLICAS", PRIMARY], |answer| {
                answer.contains(&replica.to_string())
            });
        }
        Some(Self {
            processes,
            primary,
            replica,
            sentinels,
        })
    }

    /// A Sentinel client for the primary.
    #[cfg(feature = "sentinel")]
    pub fn client(&self) -> redis::sentinel::SentinelClient {
        let urls: Vec<String> = self.sentinels.iter().map(|&port| url(port)).collect();
        redis::sentinel::SentinelClient::build(
            urls,
            PRIMARY.to_owned(),
            None,
            redis::sentinel::SentinelServerType::Master,
        )
        .expect("a sentinel client")
    }

    /// Kills the primary (SIGKILL); the Sentinels then promote the replica.
    pub fn kill_primary(&mut self) {
        self.processes.kill(self.primary);
    }

    /// Waits until the Sentinels name the replica as the primary.
    pub fn await_failover(&self) {
        until(
            self.sentinels[0],
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", PRIMARY],
            |answer| answer.contains(&self.replica.to_string()),
        );
    }
}
