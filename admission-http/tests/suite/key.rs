//! The key extractors allocate nothing per request and keep nothing of it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::net::SocketAddr;

use admission_core::Key;
use admission_http::key;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request};

/// Counts this thread's allocations.
struct Counting;

thread_local!(static ALLOCATIONS: Cell<usize> = const { Cell::new(0) });

// SAFETY: defers every operation to `System`; counting touches only a thread-local cell.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        // SAFETY: as `GlobalAlloc::alloc`'s caller promised.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as `GlobalAlloc::dealloc`'s caller promised.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

#[test]
fn extracting_a_key_allocates_nothing_whatever_its_length() {
    let by_header = key::header(HeaderName::from_static("x-api-key"));
    let by_peer = key::peer_ip(|addr: &SocketAddr| addr.ip());
    let peer: SocketAddr = "198.51.100.4:40000".parse().unwrap();
    let (short, long) = ("k-123".to_owned(), "x".repeat(200));
    let heads: Vec<_> = [short.as_str(), long.as_str()]
        .iter()
        .map(|value| {
            let mut request = Request::get("/")
                .header("x-api-key", *value)
                .body(())
                .unwrap();
            request.extensions_mut().insert(peer);
            request.into_parts().0
        })
        .collect();
    let before = allocations();
    let mut keys = [Key::from(0_u64); 4];
    for (i, head) in heads.iter().enumerate() {
        keys[2 * i] = by_header(head).unwrap();
        keys[2 * i + 1] = by_peer(head).unwrap();
    }
    assert_eq!(
        allocations() - before,
        0,
        "a key is made without allocating"
    );
    assert_eq!(keys[0], Key::from("k-123"));
    assert_eq!(keys[1], Key::from(peer.ip()));
    assert!(keys[2].as_bytes().is_none(), "200 bytes: held as a digest");
}

#[test]
fn a_key_keeps_nothing_of_the_request_buffer_it_was_read_from() {
    // hyper reads a request head into one buffer and hands out header values that point
    // into it: a key that kept such a value would keep the whole buffer alive.
    let buffer = Bytes::from(b"GET / HTTP/1.1\r\nx-api-key: k-123\r\n\r\n".to_vec());
    let value = HeaderValue::from_maybe_shared(buffer.slice(27..32)).unwrap();
    let request = Request::get("/")
        .header("x-api-key", value)
        .body(())
        .unwrap();
    assert!(!buffer.is_unique(), "the header value shares the buffer");
    let key = key::header(HeaderName::from_static("x-api-key"))(&request.into_parts().0);
    assert!(
        buffer.is_unique(),
        "the request is gone; the key holds no part of it"
    );
    assert_eq!(key, Some(Key::from("k-123")));
}
