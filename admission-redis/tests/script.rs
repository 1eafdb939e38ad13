//! The grant script on a real `redis-server`, against a model of what it must do: random
//! sequences of grants by three replicas, with time moved on between them.

mod support;

use std::collections::BTreeMap;

use admission_redis::script;
use proptest::prelude::*;
use support::Redis;

const TTL: u64 = 500;

#[derive(Debug, Clone)]
enum Op {
    /// Replica `0` asks for `1` slots.
    Grant(u8, u64),
    /// The clock moves on this many milliseconds.
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..3_u8, 0..20_u64).prop_map(|(replica, want)| Op::Grant(replica, want)),
        1 => (0..800_u64).prop_map(Op::Advance),
    ]
}

/// What the script must do: drop the other replicas' expired leases, grant what the cap
/// leaves of the live ones, never below 0; a grant of 0 removes the replica's lease.
fn model(
    leases: &mut BTreeMap<String, (u64, u64)>,
    replica: &str,
    want: u64,
    cap: u64,
    now: u64,
) -> u64 {
    leases.retain(|other, (_, expires)| other == replica || *expires > now);
    let others: u64 = leases
        .iter()
        .filter(|(other, _)| *other != replica)
        .map(|(_, (slots, _))| slots)
        .sum();
    let granted = want.min(cap.saturating_sub(others));
    if granted > 0 {
        leases.insert(replica.to_owned(), (granted, now + TTL));
    } else {
        leases.remove(replica);
    }
    granted
}

/// The leases Redis holds for `name`, parsed.
fn stored(connection: &mut redis::Connection, name: &str) -> BTreeMap<String, (u64, u64)> {
    let fields: BTreeMap<String, String> =
        redis::cmd("HGETALL").arg(name).query(connection).unwrap();
    fields
        .into_iter()
        .map(|(replica, lease)| {
            let (slots, expires) = lease.split_once(':').unwrap();
            (replica, (slots.parse().unwrap(), expires.parse().unwrap()))
        })
        .collect()
}

#[test]
fn the_grant_script_does_what_the_model_does_and_never_grants_past_the_cap() {
    let Some(redis) = Redis::start("grant_script") else {
        return;
    };
    // The runner's closure is `Fn`: the connection and the case number in cells.
    let connection = std::cell::RefCell::new(redis.client().get_connection().unwrap());
    let grant = redis::Script::new(script::GRANT);
    // Time starts an hour ahead of the server's, so that every expiry the script sets on
    // the hash lies in the server's future.
    let start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 3_600_000;
    let case = std::cell::Cell::new(0_u64);
    let config = ProptestConfig {
        cases: 128,
        ..ProptestConfig::default()
    };
    proptest!(config, |(cap in 1..16_u64, ops in prop::collection::vec(op(), 1..40))| {
        case.set(case.get() + 1);
        let name = format!("prop:{}", case.get());
        let mut connection = connection.borrow_mut();
        let (mut now, mut leases) = (start, BTreeMap::new());
        for op in ops {
            match op {
                Op::Advance(ms) => now += ms,
                Op::Grant(replica, want) => {
                    let replica = format!("r{replica}");
                    let granted: u64 = grant
                        .key(&name)
                        .arg(&replica)
                        .arg(want)
                        .arg(cap)
                        .arg(TTL)
                        .arg(now)
                        .invoke(&mut *connection)
                        .unwrap();
                    let expected = model(&mut leases, &replica, want, cap, now);
                    prop_assert_eq!(granted, expected, "{} asked {} at {}", replica, want, now);
                    prop_assert_eq!(&stored(&mut connection, &name), &leases);
                    let live: u64 = leases.values().filter(|(_, e)| *e > now).map(|(s, _)| s).sum();
                    prop_assert!(live <= cap, "{} live of a cap of {}", live, cap);
                }
            }
        }
    });
}

#[test]
fn the_heartbeat_counts_the_replicas_alive() {
    let Some(redis) = Redis::start("heartbeat") else {
        return;
    };
    let mut connection = redis.client().get_connection().unwrap();
    let heartbeat = redis::Script::new(script::HEARTBEAT);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
        + 3_600_000;
    let mut beat = |replica: &str, at: u64| -> u64 {
        heartbeat
            .key("replicas")
            .arg(replica)
            .arg(TTL)
            .arg(at)
            .invoke(&mut connection)
            .unwrap()
    };
    assert_eq!(beat("a", now), 1);
    assert_eq!(beat("b", now + 100), 2);
    assert_eq!(beat("a", now + 200), 2, "a beat again is one replica");
    assert_eq!(beat("c", now + 550), 3, "a until 700, b until 600, c");
    assert_eq!(beat("c", now + 600), 2, "b's expired at 600; a and c live");
    assert_eq!(beat("c", now + 1300), 1, "only c");
}
