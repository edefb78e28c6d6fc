//! placeholder
pub mod connection;
