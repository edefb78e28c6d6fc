//! AWS named profiles for s3:// sources (`--profile NAME`, or `AWS_PROFILE`):
//! the profile's section of the shared credentials file (`[NAME]` in
//! `~/.aws/credentials`, or `AWS_SHARED_CREDENTIALS_FILE`) and of the config
//! file (`[profile NAME]`, `[default]` for "default", in `~/.aws/config`, or
//! `AWS_CONFIG_FILE`), merged as the AWS CLI merges them (the credentials
//! file wins), then what of it applies given the environment
//! ([`Profile::apply`]).
//!
//! Read from a profile: static keys (`aws_access_key_id`,
//! `aws_secret_access_key`, `aws_session_token`) or a `credential_process`
//! (run by [`credential_process`](super::credential_process)), `region` and
//! `endpoint_url` (or the `s3` endpoint of its `services` section). A
//! profile whose credentials come from elsewhere (an assumed role, SSO, a
//! web identity) is refused with one line naming the key and how to export
//! the credentials instead: locafs does not run those flows. So is an
//! `endpoint_url` that is not an http(s) URL, naming the profile and file.
//!
//! The files are parsed here (a small parser of the format botocore reads
//! with Python's configparser: whole-line `#`/`;` comments, `key = value`,
//! indented sub-keys under `key =`), not by a general INI crate, because
//! the nesting matters: an `endpoint_url` indented under `s3 =` is not the
//! profile's.
//!
//! It must never print or log a secret (the keys' `Debug` hides them), and
//! never send a request nor run a command: it only reads the two files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Keys of a profile that get credentials by a flow locafs does not run.
const UNSUPPORTED: &[&str] = &[
    "role_arn",
    "source_profile",
    "credential_source",
    "web_identity_token_file",
    "sso_session",
    "sso_start_url",
    "sso_account_id",
    "sso_role_name",
    "sso_region",
    "login_session",
];

/// One value of a section: a plain value, or the sub-keys indented under a
/// `key =` with nothing after the `=` (`s3 =\n  endpoint_url = ...`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    Text(String),
    Nested(BTreeMap<String, String>),
}

/// A parsed file: its sections by name (as written between the brackets,
/// trimmed), each a map of lowercased keys.
pub type Ini = BTreeMap<String, BTreeMap<String, Value>>;

/// Parses an AWS credentials or config file. Errors name the line.
pub fn parse_ini(text: &str) -> Result<Ini, String> {
    let mut ini = Ini::new();
    let mut section: Option<String> = None;
    // The last key of the section and its indentation: a line indented
    // deeper belongs to it (a sub-key if its value was empty, else a
    // continuation of its value), as in configparser.
    let mut last: Option<(String, usize)> = None;
    for (i, raw) in text.lines().enumerate() {
        let n = i + 1;
        let line = raw.trim_end_matches('\r');
        let t = line.trim();
        if t.is_empty() || t.starts_with('#') || t.starts_with(';') {
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        if let (Some(s), Some((k, level))) = (&section, &last) {
            if indent > *level {
                if let Some(Value::Nested(m)) = ini.get_mut(s).and_then(|sec| sec.get_mut(k)) {
                    let (sk, sv) =
                        split_kv(t).ok_or_else(|| format!("line {n}: expected KEY = VALUE"))?;
                    m.insert(sk, sv);
                }
                // (A continuation of a plain value: no key locafs reads
                // has one.)
                continue;
            }
        }
        if let Some(name) = t.strip_prefix('[') {
            let name = name
                .strip_suffix(']')
                .ok_or_else(|| format!("line {n}: a section header without ']'"))?
                .trim();
            ini.entry(name.to_owned()).or_default();
            section = Some(name.to_owned());
            last = None;
            continue;
        }
        let s = section
            .as_ref()
            .ok_or_else(|| format!("line {n}: a key before any [section]"))?;
        let (k, v) = split_kv(t).ok_or_else(|| format!("line {n}: expected KEY = VALUE"))?;
        let sec = ini.entry(s.clone()).or_default();
        let v = if v.is_empty() {
            Value::Nested(BTreeMap::new())
        } else {
            Value::Text(v)
        };
        sec.insert(k.clone(), v);
        last = Some((k, indent));
    }
    Ok(ini)
}

/// `key = value` (or `key: value`, as configparser takes it): the key
/// lowercased, both trimmed.
fn split_kv(t: &str) -> Option<(String, String)> {
    let at = t.find(['=', ':'])?;
    let k = t[..at].trim();
    if k.is_empty() {
        return None;
    }
    Some((k.to_ascii_lowercase(), t[at + 1..].trim().to_owned()))
}

/// A profile's `credential_process`, as read from its file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessSpec {
    /// How the profile was named (`--profile x`, `AWS_PROFILE=x`), for
    /// messages.
    pub who: String,
    /// The command line as written.
    pub command: String,
    /// Its words ([`split_command`]).
    pub argv: Vec<String>,
    /// The file it is in.
    pub file: PathBuf,
}

impl ProcessSpec {
    /// `who`'s `credential_process` `command` (in `file`), split into
    /// words; a line that cannot be split (an unclosed quote, or no words)
    /// is an error naming the profile and file.
    pub fn new(who: &str, command: &str, file: PathBuf) -> Result<ProcessSpec, String> {
        let argv = split_command(command)
            .map_err(|e| format!("{who}: credential_process (in {}) {e}", file.display()))?;
        Ok(ProcessSpec {
            who: who.to_owned(),
            command: command.to_owned(),
            argv,
            file,
        })
    }

    /// "--profile x: credential_process `cmd` (in FILE)", shortened.
    pub(super) fn label(&self) -> String {
        let mut cmd: String = self.command.chars().take(120).collect();
        if cmd.len() < self.command.len() {
            cmd.push_str("...");
        }
        format!(
            "{}: credential_process `{cmd}` (in {})",
            self.who,
            self.file.display()
        )
    }
}

/// Splits a command line into words as the AWS CLI does (Python's
/// `shlex.split` in POSIX mode).
pub fn split_command(command: &str) -> Result<Vec<String>, String> {
    match shlex::split(command) {
        None => Err("has an unclosed quote or a trailing backslash".to_owned()),
        Some(w) if w.is_empty() => Err("is empty".to_owned()),
        Some(w) => Ok(w),
    }
}

/// Checks an endpoint URL (`--endpoint`, a profile's `endpoint_url`):
/// `http://` or `https://`, a host, and a port if any that is a number.
/// Why not otherwise (a phrase).
pub fn check_endpoint(e: &str) -> Result<(), String> {
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .ok_or("is not an http:// or https:// URL")?;
    if e.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("is not a URL (it holds a space or a control character)".to_owned());
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = match host_port.strip_prefix('[') {
        // [v6]:port
        Some(v6) => match v6.split_once(']') {
            Some((h, p)) if !h.is_empty() => (h, p.strip_prefix(':')),
            _ => return Err("has a malformed [IPv6] host".to_owned()),
        },
        None => match host_port.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host_port, None),
        },
    };
    if host.is_empty() {
        return Err("has no host".to_owned());
    }
    if let Some(p) = port {
        if p.parse::<u16>().ok().filter(|&n| n > 0).is_none() {
            return Err(format!(
                "has a port {p:?} that is not a number from 1 to 65535"
            ));
        }
    }
    Ok(())
}

/// A profile's static keys. `Debug` shows the key id only.
#[derive(Clone, PartialEq, Eq)]
pub struct StaticKeys {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl std::fmt::Debug for StaticKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticKeys")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"(hidden)")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "(hidden)"),
            )
            .finish()
    }
}

/// Where the profile's name came from: the AWS CLI lets keys in the
/// environment win over `AWS_PROFILE`, but not over `--profile`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Named {
    /// `--profile` (or `profile=` in -o, `profile = ` in the TOML file).
    Flag,
    /// `AWS_PROFILE` in the environment.
    Env,
}

/// What a profile says, merged from both files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    pub name: String,
    pub named: Named,
    pub keys: Option<StaticKeys>,
    /// A key holding only one half of a key pair, if one does.
    pub half_key: Option<&'static str>,
    /// Whether `aws_access_key_id` is in the credentials file (whose keys
    /// win over a `credential_process`; the config file's do not).
    pub keys_in_credentials_file: bool,
    /// `credential_process` and the file it is in.
    pub process: Option<(String, PathBuf)>,
    pub region: Option<String>,
    pub endpoint_url: Option<String>,
    /// The file `endpoint_url` (or the `services` section naming it) is in.
    pub endpoint_file: Option<PathBuf>,
    pub ignore_endpoint_urls: bool,
    /// The first key that needs a flow locafs does not run, and the file
    /// it is in.
    pub unsupported: Option<(String, PathBuf)>,
}

/// Where the keys of a profile come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProfileKeys {
    /// Written in the profile.
    Static(StaticKeys),
    /// Printed by its `credential_process`.
    Process(ProcessSpec),
}

impl ProfileKeys {
    /// The keys written in the profile, if that is where they come from.
    pub fn static_keys(&self) -> Option<&StaticKeys> {
        match self {
            ProfileKeys::Static(k) => Some(k),
            ProfileKeys::Process(_) => None,
        }
    }
}

/// What of a profile a mount uses, once the environment is taken into
/// account (the flags are the caller's: they win over all of it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    /// The keys to sign with instead of the environment's.
    pub keys: Option<ProfileKeys>,
    pub region: Option<String>,
    pub endpoint: Option<String>,
}

/// The two files a profile is read from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Files {
    pub credentials: PathBuf,
    pub config: PathBuf,
}

impl Files {
    /// `AWS_SHARED_CREDENTIALS_FILE` and `AWS_CONFIG_FILE` (a leading `~/`
    /// is the home directory), else `~/.aws/credentials` and
    /// `~/.aws/config`. The home directory is `HOME`, else the user's entry
    /// in the password database.
    pub fn from_env(env: &dyn Fn(&str) -> Option<String>) -> Files {
        let env = |k: &str| env(k).filter(|v| !v.is_empty());
        #[allow(deprecated)] // Not deprecated since Rust 1.86; MSRV is 1.85.
        let home = || {
            env("HOME")
                .map(PathBuf::from)
                .or_else(std::env::home_dir)
                .unwrap_or_else(|| PathBuf::from("/"))
        };
        let path = |var: &str, default: &str| match env(var) {
            Some(p) => match p.strip_prefix("~/") {
                Some(rest) => home().join(rest),
                None => PathBuf::from(p),
            },
            None => home().join(".aws").join(default),
        };
        Files {
            credentials: path("AWS_SHARED_CREDENTIALS_FILE", "credentials"),
            config: path("AWS_CONFIG_FILE", "config"),
        }
    }

    /// Reads both files (a missing file is an empty one) and finds the
    /// profile: one line saying what is wrong otherwise.
    pub fn load(&self, name: &str, named: Named) -> Result<Profile, String> {
        let read = |p: &Path| match std::fs::read_to_string(p) {
            Ok(t) => Ok(Some(t)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!(
                "{}: {}: {}",
                how_named(name, named),
                p.display(),
                crate::obs::logging::short_io(&e)
            )),
        };
        let creds = read(&self.credentials)?;
        let config = read(&self.config)?;
        find_profile(
            name,
            named,
            (&self.credentials, creds.as_deref()),
            (&self.config, config.as_deref()),
        )
    }
}

fn how_named(name: &str, named: Named) -> String {
    match named {
        Named::Flag => format!("--profile {name}"),
        Named::Env => format!("AWS_PROFILE={name}"),
    }
}

/// Finds profile `name` in the texts of the credentials file and the config
/// file (None: the file does not exist), each with its path for messages:
/// the config file's section, then the credentials file's on top (its
/// values win, as in the AWS CLI). A profile in neither file is an error.
pub fn find_profile(
    name: &str,
    named: Named,
    credentials: (&Path, Option<&str>),
    config: (&Path, Option<&str>),
) -> Result<Profile, String> {
    let who = how_named(name, named);
    let parse = |(p, t): (&Path, Option<&str>)| match t {
        None => Ok((p.to_path_buf(), Ini::new())),
        Some(t) => parse_ini(t)
            .map(|ini| (p.to_path_buf(), ini))
            .map_err(|e| format!("{who}: {} {e}", p.display())),
    };
    let (creds_path, creds_ini) = parse(credentials)?;
    let (config_path, config_ini) = parse(config)?;

    // key -> (value, file), the credentials file's last so that it wins.
    let mut merged: BTreeMap<String, (Value, PathBuf)> = BTreeMap::new();
    let mut found = false;
    let in_config = section(&config_ini, &["profile", name]).or_else(|| {
        (name == "default")
            .then(|| section(&config_ini, &["default"]))
            .flatten()
    });
    for (sec, path) in [
        (in_config, &config_path),
        (creds_ini.get(name), &creds_path),
    ] {
        if let Some(sec) = sec {
            found = true;
            for (k, v) in sec {
                merged.insert(k.clone(), (v.clone(), path.clone()));
            }
        }
    }
    if !found {
        return Err(format!(
            "{who}: no such profile in {} or {}",
            creds_path.display(),
            config_path.display()
        ));
    }

    let text = |k: &str| match merged.get(k) {
        Some((Value::Text(v), _)) if !v.is_empty() => Some(v.clone()),
        _ => None,
    };
    let file = |k: &str| merged.get(k).map(|(_, p)| p.clone());
    let unsupported = UNSUPPORTED
        .iter()
        .find_map(|k| merged.get(*k).map(|(_, p)| ((*k).to_owned(), p.clone())));
    let id = text("aws_access_key_id");
    let secret = text("aws_secret_access_key");
    let half_key = match (&id, &secret) {
        (Some(_), None) => Some("aws_access_key_id"),
        (None, Some(_)) => Some("aws_secret_access_key"),
        _ => None,
    };
    let keys = match (id, secret) {
        (Some(access_key_id), Some(secret_access_key)) => Some(StaticKeys {
            access_key_id,
            secret_access_key,
            // botocore still takes the old name.
            session_token: text("aws_session_token").or_else(|| text("aws_security_token")),
        }),
        _ => None,
    };
    // A `services NAME` section's `s3 = \n endpoint_url = ...` is the s3
    // endpoint of the profiles that name it; it wins over the profile's
    // global endpoint_url.
    let service_endpoint = text("services").and_then(|s| {
        match section(&config_ini, &["services", &s])?.get("s3")? {
            Value::Nested(m) => m.get("endpoint_url").filter(|v| !v.is_empty()).cloned(),
            Value::Text(_) => None,
        }
    });
    let (endpoint_url, endpoint_file) = match service_endpoint {
        Some(e) => (Some(e), Some(config_path.clone())),
        None => (text("endpoint_url"), file("endpoint_url")),
    };
    Ok(Profile {
        name: name.to_owned(),
        named,
        keys_in_credentials_file: file("aws_access_key_id").as_ref() == Some(&creds_path),
        keys,
        half_key,
        process: text("credential_process").zip(file("credential_process")),
        region: text("region"),
        endpoint_url,
        endpoint_file,
        ignore_endpoint_urls: text("ignore_configured_endpoint_urls")
            .is_some_and(|v| v.eq_ignore_ascii_case("true")),
        unsupported,
    })
}

/// The section whose header's words are `words` (`[profile  x]` is
/// `[profile x]`, as botocore reads it).
fn section<'a>(ini: &'a Ini, words: &[&str]) -> Option<&'a BTreeMap<String, Value>> {
    ini.iter()
        .find(|(k, _)| k.split_whitespace().eq(words.iter().copied()))
        .map(|(_, v)| v)
}

impl Profile {
    /// What of this profile a mount uses, the environment being `env`:
    /// - keys: the profile's, unless the request is unsigned, or the name
    ///   came from `AWS_PROFILE` and `AWS_ACCESS_KEY_ID` is set (then the
    ///   environment's keys win, as in the AWS CLI); a profile that needs a
    ///   flow locafs does not run, or holds half a key pair, is refused then
    ///   (and only then: its keys would not be used otherwise). Which keys,
    ///   in the AWS CLI's order: those of the credentials file, else the
    ///   `credential_process`, else those of the config file;
    /// - region: the profile's unless `AWS_REGION` / `AWS_DEFAULT_REGION`
    ///   is set;
    /// - endpoint: the profile's unless `AWS_ENDPOINT_URL` (or
    ///   object_store's `AWS_ENDPOINT`, `AWS_ENDPOINT_URL_S3`) is set, or
    ///   configured endpoints are to be ignored
    ///   (`ignore_configured_endpoint_urls`,
    ///   `AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true`); one that is used
    ///   must be an http(s) URL.
    pub fn apply(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
        no_sign_request: bool,
    ) -> Result<Applied, String> {
        let set = |k: &str| env(k).is_some_and(|v| !v.is_empty());
        let who = how_named(&self.name, self.named);
        let env_keys_win = self.named == Named::Env && set("AWS_ACCESS_KEY_ID");
        let keys = if no_sign_request || env_keys_win {
            None
        } else {
            if let Some((k, file)) = &self.unsupported {
                return Err(format!(
                    "{who}: {k} (in {}) is not supported: locafs reads a profile's static keys, \
                     region and endpoint_url only; export the credentials instead, \
                     eval \"$(aws configure export-credentials --profile {} --format env)\", \
                     and mount without the profile (see docs/objstore.md)",
                    file.display(),
                    self.name
                ));
            }
            if let Some(k) = self.half_key {
                return Err(format!(
                    "{who}: {k} without its other half (aws_access_key_id and \
                     aws_secret_access_key go together)"
                ));
            }
            match (&self.keys, &self.process) {
                (Some(k), None) => Some(ProfileKeys::Static(k.clone())),
                (Some(k), Some(_)) if self.keys_in_credentials_file => {
                    Some(ProfileKeys::Static(k.clone()))
                }
                (_, Some((command, file))) => Some(ProfileKeys::Process(ProcessSpec::new(
                    &who,
                    command,
                    file.clone(),
                )?)),
                (None, None) => None,
            }
        };
        let region = if set("AWS_REGION") || set("AWS_DEFAULT_REGION") {
            None
        } else {
            self.region.clone()
        };
        let ignore = self.ignore_endpoint_urls
            || env("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
                .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let endpoint = if ignore
            || ["AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3"]
                .iter()
                .any(|k| set(k))
        {
            None
        } else {
            self.endpoint_url.clone()
        };
        if let Some(e) = &endpoint {
            check_endpoint(e).map_err(|why| {
                format!(
                    "{who}: endpoint_url {e} (in {}) {why}",
                    self.endpoint_file
                        .as_deref()
                        .unwrap_or(Path::new("?"))
                        .display()
                )
            })?;
        }
        Ok(Applied {
            keys,
            region,
            endpoint,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    const CREDS: &str = "\
# a comment
[default]
aws_access_key_id = AKIADEFAULT
aws_secret_access_key = defaultsecret

[train]
aws_access_key_id=AKIATRAIN
aws_secret_access_key = train/secret+with=equals
aws_session_token = sEsSiOn
";

    const CONFIG: &str = "\
[default]
region = eu-west-1

[profile train]
region = us-west-2
; the key below is only an s3 setting, not the profile's endpoint
s3 =
    endpoint_url = http://nested.example:1
    addressing_style = path
output = json

[profile minio]
aws_access_key_id = AKIAMINIO
aws_secret_access_key = miniosecret
endpoint_url = http://10.0.0.5:9000

[profile svc]
aws_access_key_id = A
aws_secret_access_key = B
endpoint_url = http://global:1
services = local

[services local]
s3 =
  endpoint_url = http://s3-only:2
sts =
  endpoint_url = http://sts-only:3

[profile role]
role_arn = arn:aws:iam::123:role/r
source_profile = default

[profile sso]
sso_session = corp
region = us-east-2

[profile half]
aws_access_key_id = AKIAHALF

[profile vault]
credential_process = aws-vault exec \"corp admin\" --json
region = eu-central-1

[profile badurl]
aws_access_key_id = A
aws_secret_access_key = B
endpoint_url = 10.0.0.5:9000
";

    fn find(name: &str, named: Named) -> Result<Profile, String> {
        find_profile(
            name,
            named,
            (Path::new("/h/.aws/credentials"), Some(CREDS)),
            (Path::new("/h/.aws/config"), Some(CONFIG)),
        )
    }

    #[test]
    fn parses_sections_keys_comments_and_nested_sub_keys() {
        let ini = parse_ini(CONFIG).unwrap();
        let train = &ini["profile train"];
        assert_eq!(train["region"], Value::Text("us-west-2".into()));
        assert_eq!(train["output"], Value::Text("json".into()));
        let Value::Nested(s3) = &train["s3"] else {
            panic!("s3 is not nested: {:?}", train["s3"]);
        };
        assert_eq!(s3["endpoint_url"], "http://nested.example:1");
        assert_eq!(s3["addressing_style"], "path");
        assert!(!train.contains_key("endpoint_url"));
        // '=' inside a value is the value's; keys are lowercased; CRLF.
        let ini = parse_ini("[X]\r\nAWS_Secret_Access_Key = a=b\r\n").unwrap();
        assert_eq!(ini["X"]["aws_secret_access_key"], Value::Text("a=b".into()));
    }

    #[test]
    fn a_malformed_file_names_the_line() {
        assert_eq!(
            parse_ini("region = x\n").unwrap_err(),
            "line 1: a key before any [section]"
        );
        assert_eq!(
            parse_ini("[a]\nregion = x\njunk\n").unwrap_err(),
            "line 3: expected KEY = VALUE"
        );
        assert_eq!(
            parse_ini("[a\n").unwrap_err(),
            "line 1: a section header without ']'"
        );
        let e = find_profile(
            "x",
            Named::Flag,
            (Path::new("/cr"), None),
            (Path::new("/c"), Some("[profile x]\n= 1\n")),
        )
        .unwrap_err();
        assert_eq!(e, "--profile x: /c line 2: expected KEY = VALUE");
    }

    #[test]
    fn a_profile_merges_both_files_and_the_credentials_file_wins() {
        let p = find("train", Named::Flag).unwrap();
        assert_eq!(
            p.keys,
            Some(StaticKeys {
                access_key_id: "AKIATRAIN".into(),
                secret_access_key: "train/secret+with=equals".into(),
                session_token: Some("sEsSiOn".into()),
            })
        );
        assert_eq!(p.region.as_deref(), Some("us-west-2"));
        // The nested s3 endpoint_url is not the profile's.
        assert_eq!(p.endpoint_url, None);
        assert_eq!(p.unsupported, None);

        // "default" is [default] in both files.
        let d = find("default", Named::Env).unwrap();
        assert_eq!(d.keys.unwrap().access_key_id, "AKIADEFAULT");
        assert_eq!(d.region.as_deref(), Some("eu-west-1"));

        // A key in both: the credentials file's.
        let p = find_profile(
            "p",
            Named::Flag,
            (Path::new("/cr"), Some("[p]\nregion = from-creds\n")),
            (
                Path::new("/co"),
                Some("[profile p]\nregion = from-config\n"),
            ),
        )
        .unwrap();
        assert_eq!(p.region.as_deref(), Some("from-creds"));

        // Keys only in the config file, with an endpoint.
        let m = find("minio", Named::Flag).unwrap();
        assert_eq!(m.keys.unwrap().secret_access_key, "miniosecret");
        assert_eq!(m.endpoint_url.as_deref(), Some("http://10.0.0.5:9000"));

        // A services section's s3 endpoint wins over the global one.
        let s = find("svc", Named::Flag).unwrap();
        assert_eq!(s.endpoint_url.as_deref(), Some("http://s3-only:2"));
    }

    #[test]
    fn a_missing_profile_is_one_line_naming_the_files() {
        let e = find("nope", Named::Flag).unwrap_err();
        assert_eq!(
            e,
            "--profile nope: no such profile in /h/.aws/credentials or /h/.aws/config"
        );
        let e = find_profile(
            "nope",
            Named::Env,
            (Path::new("/a"), None),
            (Path::new("/b"), None),
        )
        .unwrap_err();
        assert_eq!(e, "AWS_PROFILE=nope: no such profile in /a or /b");
        // A config section without "profile " is not a profile (but for
        // default).
        let e = find_profile(
            "p",
            Named::Flag,
            (Path::new("/cr"), None),
            (Path::new("/c"), Some("[p]\nregion = x\n")),
        )
        .unwrap_err();
        assert!(e.contains("no such profile"), "{e}");
    }

    #[test]
    fn secrets_do_not_show_in_debug() {
        let p = find("train", Named::Flag).unwrap();
        let shown = format!("{p:?}");
        assert!(shown.contains("AKIATRAIN"), "{shown}");
        assert!(!shown.contains("train/secret"), "{shown}");
        assert!(!shown.contains("sEsSiOn"), "{shown}");
    }

    #[test]
    fn unsupported_keys_are_refused_when_the_profile_would_sign() {
        let r = find("role", Named::Flag).unwrap();
        let e = r.apply(&env(&[]), false).unwrap_err();
        assert!(
            e.starts_with("--profile role: role_arn (in /h/.aws/config) is not supported"),
            "{e}"
        );
        assert!(
            e.contains("aws configure export-credentials --profile role --format env"),
            "{e}"
        );
        assert!(!e.contains('\n') && e.len() < 400, "{e}");
        let s = find("sso", Named::Env).unwrap();
        let e = s.apply(&env(&[]), false).unwrap_err();
        assert!(e.starts_with("AWS_PROFILE=sso: sso_session"), "{e}");
        // With AWS_PROFILE, keys in the environment win: the profile's
        // credentials are not used, so not refused; its region still is.
        let a = s
            .apply(&env(&[("AWS_ACCESS_KEY_ID", "AKIAENV")]), false)
            .unwrap();
        assert_eq!(a.keys, None);
        assert_eq!(a.region.as_deref(), Some("us-east-2"));
        // Unsigned requests use no credentials.
        assert!(r.apply(&env(&[]), true).unwrap().keys.is_none());
        // Half a key pair.
        let h = find("half", Named::Flag).unwrap();
        let e = h.apply(&env(&[]), false).unwrap_err();
        assert!(
            e.starts_with("--profile half: aws_access_key_id without its other half"),
            "{e}"
        );
    }

    #[test]
    fn the_flag_wins_over_keys_in_the_environment_and_aws_profile_does_not() {
        let env_keys = [
            ("AWS_ACCESS_KEY_ID", "AKIAENV"),
            ("AWS_SECRET_ACCESS_KEY", "s"),
        ];
        let flag = find("train", Named::Flag).unwrap();
        let a = flag.apply(&env(&env_keys), false).unwrap();
        assert_eq!(
            a.keys.unwrap().static_keys().unwrap().access_key_id,
            "AKIATRAIN"
        );
        let from_env = find("train", Named::Env).unwrap();
        assert_eq!(from_env.apply(&env(&env_keys), false).unwrap().keys, None);
        assert_eq!(
            from_env
                .apply(&env(&[]), false)
                .unwrap()
                .keys
                .unwrap()
                .static_keys()
                .unwrap()
                .access_key_id,
            "AKIATRAIN"
        );
    }

    #[test]
    fn the_environments_region_and_endpoint_win_over_the_profiles() {
        let m = find("minio", Named::Flag).unwrap();
        let a = m.apply(&env(&[]), false).unwrap();
        assert_eq!(a.endpoint.as_deref(), Some("http://10.0.0.5:9000"));
        for var in ["AWS_ENDPOINT_URL", "AWS_ENDPOINT", "AWS_ENDPOINT_URL_S3"] {
            let a = m.apply(&env(&[(var, "http://e:1")]), false).unwrap();
            assert_eq!(a.endpoint, None, "{var}");
        }
        let a = m
            .apply(
                &env(&[("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")]),
                false,
            )
            .unwrap();
        assert_eq!(a.endpoint, None);
        let t = find("train", Named::Flag).unwrap();
        assert_eq!(
            t.apply(&env(&[]), false).unwrap().region.as_deref(),
            Some("us-west-2")
        );
        for var in ["AWS_REGION", "AWS_DEFAULT_REGION"] {
            assert_eq!(t.apply(&env(&[(var, "x")]), false).unwrap().region, None);
        }
    }

    #[test]
    fn the_files_come_from_the_environment_or_home() {
        let f = Files::from_env(&env(&[("HOME", "/home/u")]));
        assert_eq!(f.credentials, Path::new("/home/u/.aws/credentials"));
        assert_eq!(f.config, Path::new("/home/u/.aws/config"));
        let f = Files::from_env(&env(&[
            ("HOME", "/home/u"),
            ("AWS_SHARED_CREDENTIALS_FILE", "/etc/aws/creds"),
            ("AWS_CONFIG_FILE", "~/cfg"),
        ]));
        assert_eq!(f.credentials, Path::new("/etc/aws/creds"));
        assert_eq!(f.config, Path::new("/home/u/cfg"));
    }

    #[test]
    fn load_reads_the_files_and_a_missing_file_is_empty() {
        let d = tempfile::tempdir().unwrap();
        let files = Files {
            credentials: d.path().join("credentials"),
            config: d.path().join("config"),
        };
        std::fs::write(&files.config, CONFIG).unwrap();
        let p = files.load("minio", Named::Flag).unwrap();
        assert_eq!(p.keys.unwrap().access_key_id, "AKIAMINIO");
        // Without the credentials file, train has its region and no keys.
        let p = files.load("train", Named::Flag).unwrap();
        assert_eq!((p.keys, p.region.as_deref()), (None, Some("us-west-2")));
        let e = files.load("nope", Named::Flag).unwrap_err();
        assert!(e.contains("no such profile"), "{e}");
        std::fs::write(&files.credentials, CREDS).unwrap();
        assert!(files.load("train", Named::Flag).unwrap().keys.is_some());
    }

    #[test]
    fn a_credential_process_is_split_and_ranks_as_in_the_aws_cli() {
        let v = find("vault", Named::Flag).unwrap();
        let Some(ProfileKeys::Process(p)) = v.apply(&env(&[]), false).unwrap().keys else {
            panic!("{v:?}");
        };
        assert_eq!(p.argv, ["aws-vault", "exec", "corp admin", "--json"]);
        assert_eq!(p.who, "--profile vault");
        assert_eq!(p.file, Path::new("/h/.aws/config"));
        // Unsigned, or AWS_PROFILE with keys in the environment: not used.
        assert_eq!(v.apply(&env(&[]), true).unwrap().keys, None);
        let e = find("vault", Named::Env).unwrap();
        let a = e
            .apply(&env(&[("AWS_ACCESS_KEY_ID", "AKIAENV")]), false)
            .unwrap();
        assert_eq!((a.keys, a.region.as_deref()), (None, Some("eu-central-1")));

        // Keys in the credentials file win over the process; keys in the
        // config file lose to it.
        let with = |creds: &str, config: &str| {
            find_profile(
                "p",
                Named::Flag,
                (Path::new("/cr"), Some(creds)),
                (Path::new("/co"), Some(config)),
            )
            .unwrap()
            .apply(&env(&[]), false)
            .unwrap()
            .keys
        };
        let keys = "aws_access_key_id = AKIAK\naws_secret_access_key = s\n";
        let process = "credential_process = helper --json\n";
        assert!(matches!(
            with(&format!("[p]\n{keys}"), &format!("[profile p]\n{process}")),
            Some(ProfileKeys::Static(k)) if k.access_key_id == "AKIAK"
        ));
        assert!(matches!(
            with("", &format!("[profile p]\n{keys}{process}")),
            Some(ProfileKeys::Process(p)) if p.argv == ["helper", "--json"]
        ));
        assert!(matches!(
            with(&format!("[p]\n{process}"), &format!("[profile p]\n{keys}")),
            Some(ProfileKeys::Process(p)) if p.file == Path::new("/cr")
        ));
        // A line that cannot be split names the profile and file.
        let e = find_profile(
            "q",
            Named::Flag,
            (Path::new("/cr"), None),
            (
                Path::new("/co"),
                Some("[profile q]\ncredential_process = helper 'x\n"),
            ),
        )
        .unwrap()
        .apply(&env(&[]), false)
        .unwrap_err();
        assert_eq!(
            e,
            "--profile q: credential_process (in /co) has an unclosed quote or a trailing backslash"
        );
        // Still refused with role_arn (the AWS CLI would assume the role).
        let e = find_profile(
            "r",
            Named::Flag,
            (Path::new("/cr"), None),
            (
                Path::new("/co"),
                Some("[profile r]\nrole_arn = arn:aws:iam::1:role/r\ncredential_process = x\n"),
            ),
        )
        .unwrap()
        .apply(&env(&[]), false)
        .unwrap_err();
        assert!(
            e.starts_with("--profile r: role_arn (in /co) is not supported"),
            "{e}"
        );
    }

    #[test]
    fn a_malformed_endpoint_url_names_the_profile_and_file() {
        let b = find("badurl", Named::Flag).unwrap();
        let e = b.apply(&env(&[]), false).unwrap_err();
        assert_eq!(
            e,
            "--profile badurl: endpoint_url 10.0.0.5:9000 (in /h/.aws/config) is not an \
             http:// or https:// URL"
        );
        // Not used (the environment's wins): not checked.
        let a = b
            .apply(&env(&[("AWS_ENDPOINT_URL", "http://e:1")]), false)
            .unwrap();
        assert_eq!(a.endpoint, None);
        // A services section's endpoint is the config file's.
        let e = find_profile(
            "s",
            Named::Env,
            (Path::new("/cr"), Some("[s]\nservices = x\n")),
            (
                Path::new("/co"),
                Some("[services x]\ns3 =\n  endpoint_url = http://h:99999\n"),
            ),
        )
        .unwrap()
        .apply(&env(&[]), false)
        .unwrap_err();
        assert_eq!(
            e,
            "AWS_PROFILE=s: endpoint_url http://h:99999 (in /co) has a port \"99999\" that is \
             not a number from 1 to 65535"
        );
    }
}
