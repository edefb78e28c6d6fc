//! `cargo deb` builds a package that `dpkg -i` installs and whose binary
//! runs. Ignored by default: it needs cargo-deb (`cargo install cargo-deb`)
//! and a release build (several minutes on 2 cores). Run it with
//!     cargo test --test ops_deb -- --ignored --nocapture
//! It installs into a scratch root (`dpkg --root`), not into the machine.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

#[test]
#[ignore = "needs cargo-deb and a release build; run with --ignored"]
fn cargo_deb_package_installs_and_runs() {
    if Command::new("cargo")
        .args(["deb", "--version"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        skip!("cargo-deb not installed (cargo install cargo-deb)");
    }
    if Command::new("dpkg").arg("--version").output().is_err() {
        skip!("dpkg not installed");
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out_dir = tempfile::tempdir().unwrap();
    let out = Command::new("cargo")
        .arg("deb")
        .arg("--output")
        .arg(out_dir.path())
        .current_dir(root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo deb failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let deb = std::fs::read_dir(out_dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .expect("no .deb produced");

    // The package's metadata and contents.
    let info = Command::new("dpkg-deb")
        .arg("-I")
        .arg(&deb)
        .output()
        .unwrap();
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.contains("Package: locafs"), "{info}");
    let list = Command::new("dpkg-deb")
        .arg("-c")
        .arg(&deb)
        .output()
        .unwrap();
    let list = String::from_utf8_lossy(&list.stdout);
    for f in [
        "./usr/bin/locafs",
        "./sbin/mount.fuse.locafs",
        "./lib/systemd/system/locafs@.service",
        "./etc/locafs/example.toml",
        "./usr/share/doc/locafs/operations.md",
        "./usr/share/doc/locafs/security.md",
    ] {
        assert!(list.contains(f), "{f} missing from the package:\n{list}");
    }

    // An upgrade restarts the running locafs@ units (their mounts stay:
    // systemd's file descriptor store), never inside a --root install.
    let postinst = Command::new("dpkg-deb")
        .arg("-I")
        .arg(&deb)
        .arg("postinst")
        .output()
        .unwrap();
    let postinst = String::from_utf8_lossy(&postinst.stdout);
    assert!(
        postinst.contains("systemctl try-restart") && postinst.contains("DPKG_ROOT"),
        "{postinst}"
    );

    // dpkg -i into a scratch root with its own dpkg database.
    let sys = tempfile::tempdir().unwrap();
    let db = sys.path().join("var/lib/dpkg");
    for d in ["info", "updates", "triggers"] {
        std::fs::create_dir_all(db.join(d)).unwrap();
    }
    std::fs::write(db.join("status"), "").unwrap();
    let out = Command::new("dpkg")
        .arg(format!("--root={}", sys.path().display()))
        .args([
            "--force-depends",
            "--force-not-root",
            "--force-script-chrootless",
        ])
        .arg("-i")
        .arg(&deb)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "dpkg -i failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let installed = sys.path().join("usr/bin/locafs");
    let out = Command::new(&installed).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("locafs "));
    let helper = sys.path().join("sbin/mount.fuse.locafs");
    let out = Command::new("sh").arg(&helper).output().unwrap();
    assert_eq!(out.status.code(), Some(1), "helper usage exit");
    // The example config parses as a locafs config (all keys commented).
    let example = sys.path().join("etc/locafs/example.toml");
    let text = std::fs::read_to_string(&example).unwrap();
    assert!(text.contains("#cache-size"));
    // Uncommenting every option gives a valid configuration.
    let sc = Scratch::with_sample_files();
    let conf = sc.dir.path().join("all.toml");
    let uncommented: String = text
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .filter(|l| l.contains(" = "))
        .map(|l| match l.split_once(" = ").unwrap().0 {
            "source" => format!("source = \"{}\"\n", sc.src.display()),
            "mountpoint" => format!("mountpoint = \"{}\"\n", sc.mnt.display()),
            "cache-dir" => format!("cache-dir = \"{}\"\n", sc.cache.display()),
            "cache-size" => "cache-size = \"64MiB\"\n".into(),
            "log-file" => format!("log-file = \"{}\"\n", sc.dir.path().join("l").display()),
            "metrics" => format!("metrics = \"127.0.0.1:{}\"\n", free_tcp_port()),
            _ => format!("{l}\n"),
        })
        .collect();
    std::fs::write(&conf, &uncommented).unwrap();
    require_fuse!();
    let _m = Mount::start_args(&sc.mnt, &["--config", conf.to_str().unwrap()]);
    let (name, data) = &sc.files[0];
    assert!(std::fs::read(sc.mnt.join(name)).unwrap() == *data);
}
