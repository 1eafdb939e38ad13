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

/// What Redis holds of one key: each replica's lease (slots, expiry), and each waiting
/// replica's mark (expiry).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct State {
    leases: BTreeMap<String, (u64, u64)>,
    waiting: BTreeMap<String, u64>,
}

/// What the script must do: drop what has expired; grant what the cap leaves of the other
/// live leases, never below 0, and, while replicas holding nothing wait, no more than the
/// fair share or what the replica holds; mark the replica waiting if it got less than it
/// asked, clear the mark if not; a grant of 0 removes its lease. The grant, the share, and
/// what the others are told: 1 (a waiter, while others hold slots), 2 (slots given back
/// while another waits) or 0.
fn model(state: &mut State, replica: &str, want: u64, cap: u64, now: u64) -> (u64, u64, u64) {
    let own = match state.leases.get(replica) {
        Some(&(slots, expires)) if expires > now => slots,
        _ => 0,
    };
    state
        .leases
        .retain(|other, (_, expires)| other == replica || *expires > now);
    state
        .waiting
        .retain(|other, expires| other == replica || *expires > now);
    let others = state.leases.iter().filter(|(other, _)| *other != replica);
    let (holders, held) = others.fold((0, 0), |(n, sum), (_, (slots, _))| (n + 1, sum + slots));
    let mut granted = want.min(cap.saturating_sub(held));
    let waiters = state
        .waiting
        .keys()
        .filter(|other| *other != replica && !state.leases.contains_key(*other))
        .count() as u64;
    let others_wait = state.waiting.keys().any(|other| other != replica);
    let mut fair = cap;
    if waiters > 0 {
        fair = cap.div_ceil(holders + waiters + 1);
        granted = granted.min(fair.max(own));
    }
    if granted < want {
        state.waiting.insert(replica.to_owned(), now + TTL);
    } else {
        state.waiting.remove(replica);
    }
    if granted > 0 {
        state
            .leases
            .insert(replica.to_owned(), (granted, now + TTL));
    } else {
        state.leases.remove(replica);
    }
    let said = if granted < want && holders > 0 {
        1
    } else if granted < own && others_wait {
        2
    } else {
        0
    };
    (granted, fair, said)
}

/// What Redis holds for `name`, parsed.
fn stored(connection: &mut redis::Connection, name: &str) -> State {
    let fields: BTreeMap<String, String> =
        redis::cmd("HGETALL").arg(name).query(connection).unwrap();
    let mut state = State::default();
    for (field, value) in fields {
        match field.strip_prefix('~') {
            Some(replica) => {
                state
                    .waiting
                    .insert(replica.to_owned(), value.parse().unwrap());
            }
            None => {
                let (slots, expires) = value.split_once(':').unwrap();
                state
                    .leases
                    .insert(field, (slots.parse().unwrap(), expires.parse().unwrap()));
            }
        }
    }
    state
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
        let (mut now, mut state) = (start, State::default());
        for op in ops {
            match op {
                Op::Advance(ms) => now += ms,
                Op::Grant(replica, want) => {
                    let replica = format!("r{replica}");
                    let granted: (u64, u64, u64) = grant
                        .key(&name)
                        .arg(&replica)
                        .arg(want)
                        .arg(cap)
                        .arg(TTL)
                        .arg("")
                        .arg(now)
                        .invoke(&mut *connection)
                        .unwrap();
                    let expected = model(&mut state, &replica, want, cap, now);
                    prop_assert_eq!(granted, expected, "{} asked {} at {}", replica, want, now);
                    prop_assert_eq!(&stored(&mut connection, &name), &state);
                    let live = state.leases.values().filter(|(_, e)| *e > now).map(|(s, _)| s);
                    let live: u64 = live.sum();
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

#[test]
fn the_grant_script_tells_holders_of_a_waiter_and_the_waiter_of_slots_given_back() {
    let Some(redis) = Redis::start("grant_channel") else {
        return;
    };
    let client = redis.client();
    let mut listener = client.get_connection().unwrap();
    listener
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .unwrap();
    let mut listener = listener.as_pubsub();
    listener.subscribe("leases").unwrap();
    let mut connection = client.get_connection().unwrap();
    let grant = redis::Script::new(script::GRANT);
    let mut ask = |replica: &str, want: u64| -> (u64, u64, u64) {
        grant
            .key("k:acme")
            .arg(replica)
            .arg(want)
            .arg(4)
            .arg(10_000)
            .arg("leases")
            .invoke(&mut connection)
            .unwrap()
    };
    let mut heard = || -> String { listener.get_message().unwrap().get_payload().unwrap() };
    assert_eq!(ask("a", 4).2, 0, "the whole cap, no one else: nothing said");
    assert_eq!(ask("b", 1), (0, 4, 1), "short while a holds slots");
    assert_eq!(heard(), "wb k:acme");
    assert_eq!(ask("a", 1), (1, 2, 2), "a lowers its lease while b waits");
    assert_eq!(heard(), "fa k:acme");
    assert_eq!(ask("b", 1), (1, 4, 0), "b is granted; no one waits now");
}
