//! The `locafs` command: hands over to the command line (`locafs::cli`).
//! No logic lives here.

use std::process::ExitCode;

fn main() -> ExitCode {
    locafs::cli::main()
}
