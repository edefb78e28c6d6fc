//! AWS profiles' `credential_process`: a command that prints keys as JSON
//! (`aws-vault exec x --json`, `granted`, a company's SSO helper), run as
//! the AWS CLI runs it, and an object_store [`CredentialProvider`] that
//! keeps its keys and runs it again before they expire.
//!
//! The command line is split into words as the AWS CLI splits it (Python's
//! `shlex.split`: quotes and backslashes, no shell), run with the mount's
//! environment, and must print on stdout `{"Version": 1, "AccessKeyId":
//! ..., "SecretAccessKey": ..., "SessionToken": ..., "Expiration": RFC
//! 3339}` (the last two optional) and exit 0 within [`DEADLINE`]; after it
//! the process is killed. Keys without an `Expiration` are kept for the
//! life of the mount (as the AWS CLI keeps them); others are fetched again
//! once they are within [`REFRESH_BEFORE`] of it (not more often than every
//! [`MIN_REFRESH_INTERVAL`] while they are valid: a helper that keeps
//! printing keys that expire soon is not run for every request).
//!
//! At mount ([`ProcessCredentials::start`]) a failure is one line naming the
//! profile, the command and what went wrong (its exit status and the first
//! line of its stderr), and nothing is mounted. Later, a refresh runs on
//! the source's runtime (a blocking task, bounded by the deadline), one at
//! a time: while the old keys are still valid they keep signing; once they
//! have expired and a refresh fails, the request fails (the read gets EIO,
//! as with refused keys) with a warning, and the next request tries again
//! ([`RETRY_AFTER`] after a failure at the earliest).
//!
//! It must never print or log a key, nor the command's stdout (it holds
//! them); never run the command through a shell; and never let a command
//! run past its deadline.

use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use object_store::aws::AwsCredential;
use tracing::warn;

use super::aws_profile::{ProcessSpec, StaticKeys};

/// How long the command may run before it is killed.
pub const DEADLINE: Duration = Duration::from_secs(60);
/// Keys are fetched again once they expire within this.
pub const REFRESH_BEFORE: Duration = Duration::from_secs(5 * 60);
/// While the keys in hand are valid, the command is not run again sooner
/// than this after it last printed them.
pub const MIN_REFRESH_INTERVAL: Duration = Duration::from_secs(10);
/// After a failed refresh, the command is not run again before this.
pub const RETRY_AFTER: Duration = Duration::from_secs(2);
/// Of the command's output, at most this much is read (keys are a few KiB).
const MAX_OUTPUT: u64 = 1 << 20;

/// Keys a command printed, and when they expire (None: never).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessKeys {
    pub keys: StaticKeys,
    pub expiration: Option<SystemTime>,
}

/// Parses what the command printed. Errors name the field, never a value
/// (the output holds secrets).
pub fn parse_output(stdout: &[u8]) -> Result<ProcessKeys, String> {
    let v: serde_json::Value = serde_json::from_slice(stdout)
        .map_err(|e| format!("its output is not JSON ({})", json_error(&e)))?;
    let obj = v.as_object().ok_or("its output is not a JSON object")?;
    match obj.get("Version") {
        Some(n) if n.as_u64() == Some(1) => {}
        Some(n) if n.is_number() => {
            return Err(format!("its output has Version {n}; only 1 is known"));
        }
        Some(_) => return Err("its output's Version is not the number 1".to_owned()),
        None => return Err("its output has no Version (1)".to_owned()),
    }
    let text = |k: &str, required: bool| -> Result<Option<String>, String> {
        match obj.get(k) {
            Some(serde_json::Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
            None | Some(serde_json::Value::Null) if !required => Ok(None),
            None | Some(serde_json::Value::Null) => Err(format!("its output has no {k}")),
            Some(serde_json::Value::String(_)) if !required => Ok(None),
            Some(serde_json::Value::String(_)) => Err(format!("its output's {k} is empty")),
            Some(_) => Err(format!("its output's {k} is not a string")),
        }
    };
    let access_key_id = text("AccessKeyId", true)?.unwrap_or_default();
    let secret_access_key = text("SecretAccessKey", true)?.unwrap_or_default();
    let session_token = text("SessionToken", false)?;
    let expiration = match text("Expiration", false)? {
        None => None,
        Some(s) => Some(
            parse_expiration(&s)
                .ok_or_else(|| format!("its output's Expiration {s:?} is not an RFC 3339 time"))?,
        ),
    };
    Ok(ProcessKeys {
        keys: StaticKeys {
            access_key_id,
            secret_access_key,
            session_token,
        },
        expiration,
    })
}

/// A serde_json error without the text it quotes (its position only).
fn json_error(e: &serde_json::Error) -> String {
    use serde_json::error::Category;
    let what = match e.classify() {
        Category::Eof => "it ends early",
        Category::Syntax => "a syntax error",
        Category::Data | Category::Io => "unexpected data",
    };
    if e.line() == 0 {
        what.to_owned()
    } else {
        format!("{what} at line {} column {}", e.line(), e.column())
    }
}

/// An RFC 3339 time (`2026-12-03T14:00:00Z`, `...+01:00`, with fractions).
pub fn parse_expiration(s: &str) -> Option<SystemTime> {
    chrono::DateTime::parse_from_rfc3339(s.trim())
        .ok()
        .map(SystemTime::from)
}

/// Whether keys expiring at `expiration`, fetched `since_fetch` ago, should
/// be fetched again at `now`.
pub fn needs_refresh(
    expiration: Option<SystemTime>,
    now: SystemTime,
    since_fetch: Duration,
) -> bool {
    expiration.is_some_and(|e| now + REFRESH_BEFORE >= e)
        && (since_fetch >= MIN_REFRESH_INTERVAL || !still_valid(expiration, now))
}

/// Whether keys expiring at `expiration` may still sign at `now`.
pub fn still_valid(expiration: Option<SystemTime>, now: SystemTime) -> bool {
    expiration.is_none_or(|e| now < e)
}

/// What the command's stdin is: the terminal's at mount (a helper may ask
/// for an MFA code), nothing on a refresh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stdin {
    Inherit,
    Null,
}

/// Runs `argv` within `deadline` (killed after it) and returns its stdout
/// if it exited 0; else why not, with the first line of its stderr.
///
/// With no stdin (a refresh), the command runs in a process group of its
/// own, and the whole group is killed at the deadline (a `sh -c` helper's
/// children too). With the terminal's (at mount), it stays in locafs's
/// group, so that it may read the terminal (a process of a background group
/// would be stopped), and only the command itself is killed.
pub fn run(argv: &[String], deadline: Duration, stdin: Stdin) -> Result<Vec<u8>, String> {
    use std::os::unix::process::CommandExt;
    let (prog, args) = argv.split_first().ok_or("is empty")?;
    let mut cmd = Command::new(prog);
    cmd.args(args)
        .stdin(match stdin {
            Stdin::Inherit => Stdio::inherit(),
            Stdin::Null => Stdio::null(),
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if stdin == Stdin::Null {
        cmd.process_group(0);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot be run: {}", crate::obs::logging::short_io(&e)))?;
    let kill = |child: &mut std::process::Child| {
        if stdin == Stdin::Null {
            if let Ok(pid) = i32::try_from(child.id()) {
                // SAFETY: kill(2) has no memory preconditions; -pid is the
                // group this command leads (made above), not ours.
                unsafe { libc::kill(-pid, libc::SIGKILL) };
            }
        }
        let _ = child.kill();
        let _ = child.wait();
    };
    // Both pipes are read on threads of their own, so that a command that
    // writes much to one is not blocked while this waits for it to exit.
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        let (tx, rx) = std::sync::mpsc::channel();
        if let Some(mut p) = pipe {
            std::thread::spawn(move || {
                let mut kept = Vec::new();
                let _ = (&mut p).take(MAX_OUTPUT).read_to_end(&mut kept);
                // Drain the rest (unkept) so the writer is never blocked.
                let _ = std::io::copy(&mut p, &mut std::io::sink());
                let _ = tx.send(kept);
            });
        }
        rx
    };
    let out = reader(child.stdout.take().map(|p| Box::new(p) as _));
    let err = reader(child.stderr.take().map(|p| Box::new(p) as _));
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if t0.elapsed() >= deadline => {
                kill(&mut child);
                return Err(format!(
                    "did not finish within {}s (killed)",
                    deadline.as_secs_f64()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            Err(e) => {
                kill(&mut child);
                return Err(format!("cannot be waited for: {e}"));
            }
        }
    };
    // A child of the command may still hold the pipes open: wait for them a
    // little, not forever.
    let grace = Duration::from_secs(2);
    let stderr = err.recv_timeout(grace).unwrap_or_default();
    let first_err = String::from_utf8_lossy(&stderr)
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .map(|l| l.chars().take(200).collect::<String>());
    let said = first_err.map(|l| format!(": {l}")).unwrap_or_default();
    if !status.success() {
        use std::os::unix::process::ExitStatusExt;
        return Err(match (status.code(), status.signal()) {
            (Some(c), _) => format!("exited with status {c}{said}"),
            (None, Some(s)) => format!("was killed by signal {s}{said}"),
            (None, None) => format!("failed ({status}){said}"),
        });
    }
    out.recv_timeout(grace)
        .map_err(|_| "exited 0 but its output did not end (a child of it holds it open)".to_owned())
}

/// Runs the command once and parses its keys: why not otherwise (without
/// the label).
fn fetch(spec: &ProcessSpec, stdin: Stdin, now: SystemTime) -> Result<ProcessKeys, String> {
    let out = run(&spec.argv, DEADLINE, stdin)?;
    let k = parse_output(&out)?;
    if !still_valid(k.expiration, now) {
        return Err(format!(
            "its keys have already expired (Expiration {})",
            chrono::DateTime::<chrono::Utc>::from(k.expiration.unwrap_or(now)).to_rfc3339()
        ));
    }
    Ok(k)
}

fn credential(k: &StaticKeys) -> Arc<AwsCredential> {
    Arc::new(AwsCredential {
        key_id: k.access_key_id.clone(),
        secret_key: k.secret_access_key.clone(),
        token: k.session_token.clone(),
    })
}

/// The keys in hand and what the last failed refresh said.
struct State {
    /// The keys, their expiration and when the command printed them.
    current: Option<(Arc<AwsCredential>, Option<SystemTime>, Instant)>,
    failed: Option<(Instant, String)>,
}

/// The credentials of a `credential_process` profile for object_store's S3
/// client (see the module comment).
pub struct ProcessCredentials {
    spec: Arc<ProcessSpec>,
    state: Arc<parking_lot::Mutex<State>>,
    /// Held while the command runs: one refresh at a time.
    refreshing: Arc<tokio::sync::Mutex<()>>,
}

impl std::fmt::Debug for ProcessCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessCredentials")
            .field("who", &self.spec.who)
            .field("command", &self.spec.command)
            .finish_non_exhaustive()
    }
}

impl ProcessCredentials {
    /// Runs the command once (with the terminal's stdin), at mount: one line
    /// naming the profile, the command and what went wrong otherwise.
    pub fn start(spec: ProcessSpec) -> Result<ProcessCredentials, String> {
        let k = fetch(&spec, Stdin::Inherit, SystemTime::now())
            .map_err(|e| format!("{} {e}", spec.label()))?;
        Ok(ProcessCredentials {
            state: Arc::new(parking_lot::Mutex::new(State {
                current: Some((credential(&k.keys), k.expiration, Instant::now())),
                failed: None,
            })),
            spec: Arc::new(spec),
            refreshing: Arc::new(tokio::sync::Mutex::new(())),
        })
    }

    /// The keys in hand if they need no refresh; else the ones still valid
    /// (if any) as the second value.
    fn cached(&self, now: SystemTime) -> Result<Arc<AwsCredential>, Option<Arc<AwsCredential>>> {
        let st = self.state.lock();
        match &st.current {
            Some((c, exp, at)) if !needs_refresh(*exp, now, at.elapsed()) => Ok(Arc::clone(c)),
            Some((c, exp, _)) if still_valid(*exp, now) => Err(Some(Arc::clone(c))),
            _ => Err(None),
        }
    }
}

fn refused(why: String) -> object_store::Error {
    object_store::Error::Generic {
        store: "S3",
        source: why.into(),
    }
}

#[async_trait::async_trait]
impl object_store::CredentialProvider for ProcessCredentials {
    type Credential = AwsCredential;

    async fn get_credential(&self) -> object_store::Result<Arc<AwsCredential>> {
        let usable = match self.cached(SystemTime::now()) {
            Ok(c) => return Ok(c),
            Err(u) => u,
        };
        // One refresh at a time: while one runs, requests that still hold
        // valid keys sign with them; the others wait for it.
        let guard = match &usable {
            Some(c) => match Arc::clone(&self.refreshing).try_lock_owned() {
                Ok(g) => g,
                Err(_) => return Ok(Arc::clone(c)),
            },
            None => Arc::clone(&self.refreshing).lock_owned().await,
        };
        // Refreshed while this waited?
        let usable = match self.cached(SystemTime::now()) {
            Ok(c) => return Ok(c),
            Err(u) => u,
        };
        if let Some((at, why)) = &self.state.lock().failed {
            if at.elapsed() < RETRY_AFTER {
                return usable.ok_or_else(|| refused(why.clone()));
            }
        }
        // The command runs on a blocking thread, in a task of its own that
        // stores what it got even if this request gives up waiting.
        let (spec, state) = (Arc::clone(&self.spec), Arc::clone(&self.state));
        let task = tokio::task::spawn_blocking(move || {
            let _guard = guard;
            let r = fetch(&spec, Stdin::Null, SystemTime::now());
            let mut st = state.lock();
            match r {
                Ok(k) => {
                    let c = credential(&k.keys);
                    st.current = Some((Arc::clone(&c), k.expiration, Instant::now()));
                    st.failed = None;
                    Ok(c)
                }
                Err(e) => {
                    let why = format!("{} {e}", spec.label());
                    warn!("refreshing the keys failed: {why}");
                    st.failed = Some((Instant::now(), why.clone()));
                    Err(why)
                }
            }
        });
        match task.await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(why)) => usable.ok_or_else(|| refused(why)),
            Err(e) => usable.ok_or_else(|| refused(format!("{}: {e}", self.spec.label()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::aws_profile::split_command;
    use super::*;

    const T0: &str = "2026-12-03T14:00:00Z";

    fn at(s: &str) -> SystemTime {
        parse_expiration(s).unwrap()
    }

    #[test]
    fn the_output_is_parsed_as_the_aws_cli_reads_it() {
        let k = parse_output(
            br#"{"Version": 1, "AccessKeyId": "AKIAX", "SecretAccessKey": "s/e+c",
                "SessionToken": "tok", "Expiration": "2026-12-03T14:00:00Z"}"#,
        )
        .unwrap();
        assert_eq!(k.keys.access_key_id, "AKIAX");
        assert_eq!(k.keys.secret_access_key, "s/e+c");
        assert_eq!(k.keys.session_token.as_deref(), Some("tok"));
        assert_eq!(
            k.expiration.unwrap(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_306_400)
        );
        // Optional fields; unknown ones are ignored; null is absent.
        let k = parse_output(
            br#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":"S","SessionToken":null,"Other":3}"#,
        )
        .unwrap();
        assert_eq!((k.keys.session_token, k.expiration), (None, None));
        // Offsets and fractions.
        assert_eq!(
            at("2026-12-03T15:00:00.250+01:00"),
            at(T0) + Duration::from_millis(250)
        );
    }

    #[test]
    fn bad_output_names_the_field_never_a_value() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "its output is not JSON (it ends early"),
            (b"AKIASECRET", "its output is not JSON (a syntax error at line 1"),
            (b"[1]", "its output is not a JSON object"),
            (br#"{"AccessKeyId":"A","SecretAccessKey":"S"}"#, "has no Version (1)"),
            (br#"{"Version":2,"AccessKeyId":"A","SecretAccessKey":"S"}"#, "Version 2; only 1"),
            (br#"{"Version":"1","AccessKeyId":"A","SecretAccessKey":"S"}"#, "Version is not the number 1"),
            (br#"{"Version":1,"SecretAccessKey":"SECRET"}"#, "has no AccessKeyId"),
            (br#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":""}"#, "SecretAccessKey is empty"),
            (br#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":7}"#, "SecretAccessKey is not a string"),
            (
                br#"{"Version":1,"AccessKeyId":"A","SecretAccessKey":"SECRET","Expiration":"tomorrow"}"#,
                "Expiration \"tomorrow\" is not an RFC 3339 time",
            ),
        ];
        for (out, want) in cases {
            let e = parse_output(out).unwrap_err();
            assert!(e.contains(want), "{}: {e}", String::from_utf8_lossy(out));
            assert!(!e.contains("SECRET"), "{e}");
        }
    }

    #[test]
    fn keys_are_refreshed_within_five_minutes_of_expiry_and_used_until_it() {
        let exp = Some(at(T0));
        let before = |s: u64| at(T0) - Duration::from_secs(s);
        let long = Duration::from_secs(3600);
        assert!(!needs_refresh(exp, before(301), long));
        assert!(needs_refresh(exp, before(300), long));
        assert!(needs_refresh(exp, before(1), long));
        assert!(still_valid(exp, before(1)));
        assert!(!still_valid(exp, at(T0)));
        assert!(needs_refresh(exp, at(T0) + Duration::from_secs(1), long));
        // Printed less than MIN_REFRESH_INTERVAL ago: not again while
        // valid; at once once expired.
        let just = MIN_REFRESH_INTERVAL - Duration::from_millis(1);
        assert!(!needs_refresh(exp, before(1), just));
        assert!(needs_refresh(exp, before(1), MIN_REFRESH_INTERVAL));
        assert!(needs_refresh(exp, at(T0), Duration::ZERO));
        // No Expiration: never refreshed, always valid.
        assert!(!needs_refresh(None, at(T0), long));
        assert!(still_valid(None, at(T0)));
    }

    #[test]
    fn the_command_is_split_as_pythons_shlex_splits_it() {
        assert_eq!(
            split_command(r#"aws-vault exec "my profile" --json"#).unwrap(),
            ["aws-vault", "exec", "my profile", "--json"]
        );
        assert_eq!(
            split_command(r#"/opt/x\ y/helper 'a "b"' c\"d"#).unwrap(),
            ["/opt/x y/helper", "a \"b\"", "c\"d"]
        );
        assert!(split_command("helper 'unclosed").is_err());
        assert!(split_command("   ").is_err());
        let e = ProcessSpec::new("--profile p", "x \"y", PathBuf::from("/c")).unwrap_err();
        assert_eq!(
            e,
            "--profile p: credential_process (in /c) has an unclosed quote or a trailing backslash"
        );
    }

    fn sh(script: &str) -> Vec<String> {
        vec!["sh".into(), "-c".into(), script.into()]
    }

    #[test]
    fn a_command_that_fails_says_its_status_and_first_stderr_line() {
        let e = run(
            &sh("echo; echo 'token expired: log in again' >&2; echo more >&2; exit 3"),
            DEADLINE,
            Stdin::Null,
        )
        .unwrap_err();
        assert_eq!(e, "exited with status 3: token expired: log in again");
        let e = run(&sh("kill -9 $$"), DEADLINE, Stdin::Null).unwrap_err();
        assert_eq!(e, "was killed by signal 9");
        let e = run(&["/nonexistent/helper".into()], DEADLINE, Stdin::Null).unwrap_err();
        assert!(e.starts_with("cannot be run: "), "{e}");
        assert_eq!(
            run(&sh("echo '{}'"), DEADLINE, Stdin::Null).unwrap(),
            b"{}\n"
        );
    }

    #[test]
    fn a_command_past_its_deadline_is_killed_with_its_children() {
        let d = tempfile::tempdir().unwrap();
        let pidfile = d.path().join("child");
        // A shell that waits on a child of its own (which holds the pipes).
        let script = format!("sleep 30 & echo $! > {}; wait", pidfile.display());
        let t0 = Instant::now();
        let e = run(&sh(&script), Duration::from_millis(500), Stdin::Null).unwrap_err();
        assert_eq!(e, "did not finish within 0.5s (killed)");
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The child is gone too: killed (a zombie until whoever adopted it
        // reaps it) or reaped.
        let gone = (0..500).any(|_| {
            let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| Some(s.rsplit_once(") ")?.1.starts_with('Z')))
                .is_some_and(|zombie| !zombie);
            if alive {
                std::thread::sleep(Duration::from_millis(10));
            }
            !alive
        });
        assert!(gone, "the command's child {pid} outlived the deadline");
        // At mount (the terminal's stdin) the command itself is killed.
        let e = run(
            &sh("exec sleep 30"),
            Duration::from_millis(300),
            Stdin::Inherit,
        )
        .unwrap_err();
        assert_eq!(e, "did not finish within 0.3s (killed)");
    }

    #[test]
    fn start_names_the_profile_and_command_on_failure() {
        let spec = ProcessSpec::new(
            "--profile p",
            "sh -c 'echo nope >&2; exit 1'",
            PathBuf::from("/h/.aws/config"),
        )
        .unwrap();
        let e = ProcessCredentials::start(spec).unwrap_err();
        assert_eq!(
            e,
            "--profile p: credential_process `sh -c 'echo nope >&2; exit 1'` (in /h/.aws/config) \
             exited with status 1: nope"
        );
        // Keys that have already expired are refused too.
        let spec = ProcessSpec::new(
            "--profile p",
            r#"echo '{"Version":1,"AccessKeyId":"A","SecretAccessKey":"S","Expiration":"2020-01-01T00:00:00Z"}'"#,
            PathBuf::from("/c"),
        )
        .unwrap();
        let e = ProcessCredentials::start(spec).unwrap_err();
        assert!(
            e.ends_with("its keys have already expired (Expiration 2020-01-01T00:00:00+00:00)"),
            "{e}"
        );
    }

    #[test]
    fn the_provider_refreshes_near_expiry_fails_once_expired_and_tries_again() {
        use object_store::CredentialProvider;
        let d = tempfile::tempdir().unwrap();
        let script = d.path().join("helper");
        // Each run prints the next key, expiring in 3-4 s (so always within
        // the refresh window); with `fail` present it fails instead.
        std::fs::write(
            &script,
            "#!/bin/sh\ncd \"$(dirname \"$0\")\"\n\
             n=$(( $(cat count 2>/dev/null || echo 0) + 1 )); echo $n > count\n\
             if [ -e fail ]; then echo 'sso token expired' >&2; exit 1; fi\n\
             printf '{\"Version\": 1, \"AccessKeyId\": \"AKIA%04d\", \"SecretAccessKey\": \"s\", \
             \"Expiration\": \"%s\"}' $n \"$(date -u -d '+4 seconds' +%Y-%m-%dT%H:%M:%SZ)\"\n",
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let runs = || {
            std::fs::read_to_string(d.path().join("count"))
                .unwrap()
                .trim()
                .parse::<u32>()
                .unwrap()
        };
        let spec =
            ProcessSpec::new("--profile p", script.to_str().unwrap(), PathBuf::from("/c")).unwrap();
        let p = ProcessCredentials::start(spec).unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let get = || rt.block_on(p.get_credential());
        // Within the window, but just printed: kept.
        assert_eq!(get().unwrap().key_id, "AKIA0001");
        assert_eq!(runs(), 1);
        // Printed MIN_REFRESH_INTERVAL ago (made so): run again.
        let age = |p: &ProcessCredentials| {
            let mut st = p.state.lock();
            let c = st.current.as_mut().unwrap();
            c.2 = Instant::now().checked_sub(MIN_REFRESH_INTERVAL).unwrap();
        };
        age(&p);
        assert_eq!(get().unwrap().key_id, "AKIA0002");
        assert_eq!(runs(), 2);
        // Expired, and the command fails: an error naming it, not the old
        // keys.
        std::fs::write(d.path().join("fail"), "").unwrap();
        std::thread::sleep(Duration::from_millis(4100));
        let e = get().unwrap_err().to_string();
        assert!(
            e.contains("--profile p: credential_process `")
                && e.contains("exited with status 1: sso token expired"),
            "{e}"
        );
        assert_eq!(runs(), 3);
        // Not run again at once...
        assert!(get().is_err());
        assert_eq!(runs(), 3);
        // ...but once RETRY_AFTER has passed, and it works again.
        std::fs::remove_file(d.path().join("fail")).unwrap();
        std::thread::sleep(RETRY_AFTER);
        assert_eq!(get().unwrap().key_id, "AKIA0004");
    }
}
