//! `locafs secret`: a new cluster secret, written where only its owner can
//! read it. Whoever reads the secret can join the cluster and read every
//! cached block of the data set from any node, whatever the file modes at
//! the source (docs/security.md), so it must never land in a file others
//! can read.
//!
//! `--out FILE` creates FILE with mode 0600 (never an existing file, never
//! through a symlink). Without it the secret goes to stdout, for pipes and
//! `$(locafs secret)`; when stdout is a regular file that the group or
//! others may open (the shell's `> FILE` under umask 022 makes 0644), it is
//! refused rather than fixed: the file was readable from the moment the
//! shell created it, and a descriptor someone opened in that instant would
//! still read the secret after a `chmod`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Arguments of `locafs secret`.
#[derive(clap::Args, Debug, Default)]
pub struct SecretArgs {
    /// Write the secret to FILE (created with mode 0600; an existing FILE is
    /// left alone) instead of stdout.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

pub fn main(args: SecretArgs) -> ExitCode {
    let secret = match crate::peer::tls::generate_secret() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("locafs: {e}");
            return ExitCode::from(1);
        }
    };
    let written = match &args.out {
        Some(p) => write_new(p, &secret),
        None => to_stdout(&secret),
    };
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("locafs: {e}");
            ExitCode::from(1)
        }
    }
}

/// Creates `path` (0600, whatever the umask) holding `secret`.
fn write_new(path: &Path, secret: &str) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                format!(
                    "{} exists: remove it first (a new secret replaces the cluster's: every \
                     node needs the same one)",
                    path.display()
                )
            } else {
                format!("{}: {}", path.display(), crate::obs::logging::short_io(&e))
            }
        })?;
    f.write_all(format!("{secret}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {}", path.display(), crate::obs::logging::short_io(&e)))
}

/// Prints `secret`, unless stdout is a file others may open.
fn to_stdout(secret: &str) -> Result<(), String> {
    let st = rustix::fs::fstat(std::io::stdout()).map_err(|e| format!("stdout: {e}"))?;
    let regular = rustix::fs::FileType::from_raw_mode(st.st_mode).is_file();
    if regular && st.st_mode & 0o077 != 0 {
        return Err(format!(
            "stdout is a file the group or others may read (mode {:04o}): the secret was not \
             written. Use `locafs secret --out FILE` (made 0600), or `(umask 077; locafs secret \
             > FILE)`",
            st.st_mode & 0o7777
        ));
    }
    println!("{secret}");
    Ok(())
}
