//! `locafs where MNT [FILE...] [--json]`: which node owns each file of a
//! mount and whether it is cached on this node (the control socket's
//! `where` request; docs/locality.md). A summary for people, the raw answer
//! with `--json` for scripts. Files not found are reported, not fatal.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::mount::control::{Request, Response};

/// Arguments of `locafs where`.
#[derive(clap::Args, Debug)]
pub struct WhereArgs {
    /// The mountpoint.
    pub mountpoint: PathBuf,
    /// Files, relative to the mount root (or absolute paths under it). None:
    /// every file of the data set, in listing order (depth first, each
    /// directory's entries sorted by name).
    pub files: Vec<PathBuf>,
    /// Print the raw answer as one JSON object: ok, node_index, num_nodes,
    /// members (member ids by node index), owners and cached (one entry per
    /// file; owner null for a file not found), files (how many were
    /// answered), unknown (how many were not found), and paths when no
    /// FILE was given (docs/locality.md).
    #[arg(long)]
    pub json: bool,
}

pub fn main(args: WhereArgs) -> ExitCode {
    let (root, mut c) = match super::control::connect_mount(&args.mountpoint) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let asked: Option<Vec<PathBuf>> = (!args.files.is_empty()).then(|| {
        args.files
            .iter()
            .map(|f| super::control::relative(f, &root, &args.mountpoint))
            .collect()
    });
    // The summary reads the packed form (compact for millions of files);
    // --json prints the plain one, for scripts.
    let r = match c.call(&Request::Where {
        paths: asked.clone(),
        joined: None,
        payload: None,
        packed: !args.json,
    }) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("locafs: {e}");
            return ExitCode::from(1);
        }
    };
    if args.json {
        println!("{}", serde_json::to_string(&r).unwrap_or_default());
    } else {
        print_summary(&r, asked.as_deref());
    }
    if r.ok {
        ExitCode::SUCCESS
    } else {
        if !args.json {
            eprintln!("locafs: {}", r.error.as_deref().unwrap_or("where failed"));
        }
        ExitCode::from(1)
    }
}

fn print_summary(r: &Response, asked: Option<&[PathBuf]>) {
    let nodes = r.num_nodes.unwrap_or(1);
    let members = r.members.as_deref().unwrap_or_default();
    match r.node_index {
        Some(i) => match members.get(i as usize) {
            Some(id) => println!("this node: {i} of {nodes} ({id})"),
            None => println!("this node: {i} of {nodes} (no peers)"),
        },
        None => println!("this node: not in its own --peers list (yet); {nodes} nodes"),
    }
    if members.len() > 1 {
        for (i, m) in members.iter().enumerate() {
            println!("  node {i}: {m}");
        }
    }
    let owners = r.where_owners().unwrap_or_default();
    let cached = r.where_cached().unwrap_or_default();
    let mut per_owner: BTreeMap<u32, u64> = BTreeMap::new();
    for o in owners.iter().flatten() {
        *per_owner.entry(*o).or_default() += 1;
    }
    let here = cached.iter().filter(|c| **c).count();
    let shares: Vec<String> = per_owner
        .iter()
        .map(|(o, n)| format!("node {o}: {n}"))
        .collect();
    println!(
        "{} files; owned by {}; {here} cached here; {} not found",
        owners.len(),
        if shares.is_empty() {
            "nobody".to_owned()
        } else {
            shares.join(", ")
        },
        r.unknown
    );
    if let Some(e) = r.error.as_deref().filter(|_| r.ok) {
        println!("note: {e}");
    }
    let Some(asked) = asked else { return };
    for (i, p) in asked.iter().enumerate() {
        match owners.get(i).copied().flatten() {
            Some(o) => println!(
                "{}\tnode {o}\t{}",
                p.display(),
                if cached.get(i).copied().unwrap_or(false) {
                    "cached here"
                } else {
                    "not cached here"
                }
            ),
            None => println!("{}\tnot found", p.display()),
        }
    }
}
