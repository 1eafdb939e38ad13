//! Reads criterion's saved estimates and prints medians and ratios, group by group.
//!
//! In each group (and, in `contended`, each of its `count_`, `bytes_` and `keyed_`
//! families) the row named `admission` (or `…_admission`) is ours and the row ending in
//! `floor` is the floor; every row shows its ratio to both. The targets of the bench
//! issue are checked at the end against ratios measured in the same run. The `scaling`
//! group has a table of its own: each bench across thread counts.

mod callgrind;
mod read;
mod table;
mod targets;

pub use callgrind::{Instructions, KEYED_VARIANTS, LAYER_VARIANTS, instructions};
pub use read::{Medians, Runs, read, read_runs};
pub use table::table;
pub use targets::{RUNS, targets};

#[cfg(test)]
mod tests;
