//! The `locafs` command: parses the command line and hands over to the
//! subcommand. No logic lives here.

use std::process::ExitCode;

use clap::Parser;
use locafs::config::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Mount(args) => locafs::mount::main(*args),
        Command::Stats(args) => locafs::cli_stats::main(args),
        Command::Warm(args) => locafs::cli_control::warm(args),
        Command::Plan(args) => locafs::cli_control::plan(args),
        Command::Secret => match locafs::peer::tls::generate_secret() {
            Ok(s) => {
                println!("{s}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("locafs: {e}");
                ExitCode::from(1)
            }
        },
    }
}
