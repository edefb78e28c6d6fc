//! The `locafs` command: hands over to the command line (`locafs::cli`).
//! No logic lives here. It is the binary's root (Cargo.toml's `[[bin]]`),
//! not a module of `cli`.

use std::process::ExitCode;

fn main() -> ExitCode {
    locafs::cli::main()
}
