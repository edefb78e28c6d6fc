//! Metadata: the source tree as the kernel sees it. `namespace` (inodes,
//! attributes, listings and ACLs, revalidated against the source in time;
//! its records are `table`'s, pure bookkeeping with no source call),
//! `manifest` (the tree saved in the cache directory, so that a remount
//! does not walk the source again) and `epoch` (which files the loader has
//! read this pass, pure bookkeeping that read-ahead feeds).
//!
//! It never reads file data and never calls the source without a deadline
//! (every call goes through `source::guard`).

pub mod epoch;
pub mod manifest;
pub mod namespace;
pub mod table;
