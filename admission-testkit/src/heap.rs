//! A global allocator that counts the bytes live on the heap, for the tests that check
//! that closed connections and attacks leave nothing behind. Each test binary that
//! calls [`count_the_heap!`](crate::count_the_heap) counts its own heap.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

/// Counts the bytes live on the heap, to see that closed connections leave nothing:
/// installed as a test binary's allocator by [`count_the_heap!`](crate::count_the_heap).
pub struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

// SAFETY: delegates to the system allocator; the counter is only arithmetic.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let size = layout.size() as isize;
        PEAK.fetch_max(
            LIVE.fetch_add(size, Ordering::Relaxed) + size,
            Ordering::Relaxed,
        );
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on unchanged.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Makes [`Counting`] this binary's allocator: call once, at a test file's top level.
#[macro_export]
macro_rules! count_the_heap {
    () => {
        #[global_allocator]
        static ALLOCATOR: $crate::heap::Counting = $crate::heap::Counting;
    };
}

/// The bytes live on the heap now.
pub fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// The most bytes live at once since the last call, and starts the next period at what
/// is live now.
pub fn peak() -> usize {
    PEAK.swap(live(), Ordering::Relaxed).max(0) as usize
}
