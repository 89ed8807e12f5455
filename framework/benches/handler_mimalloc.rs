//! The handler benchmark (`benches/handler.rs`, the same groups, rows and modes) with
//! mimalloc as the process's global allocator instead of glibc's `malloc`: what a function
//! that sets `#[global_allocator]` gets, and what `BatchOptions::overlap_reading` is for
//! (the overlap hands values allocated on one thread to another, which glibc's arenas
//! serialize on their locks; mimalloc frees them to thread-local lists).
//!
//! ```sh
//! cargo bench -p lambda-streams --bench handler_mimalloc -- handler/lambda_streams_six
//! ```

#![allow(missing_docs)]

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[path = "handler.rs"]
mod handler;

fn main() {
    handler::main();
}
