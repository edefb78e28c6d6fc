//! The options of a mount, merged into one [`MountConfig`]: flags override
//! `-o` options, which override the TOML file (`--config`), which overrides
//! the defaults. Also the checks that run before anything is mounted, each
//! failing with a one-line message and exit status 2. Sizes and durations
//! arrive parsed ([`Size`], [`Span`]); the command line itself, clap's
//! types and the help texts, is `cli` (`cli::mount_args`).
//!
//! Nothing here touches the cache contents or mounts anything, or knows
//! clap: the options are plain types.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::obs::logging::{short_io, LogFormat};
use crate::sys::units::{ParseError, Size, Span};

/// What the user asked to mount: SOURCE, MOUNTPOINT and the options from
/// the three places, before [`resolve`] merges and checks them (the command
/// line's `locafs mount` gives one; so does a `__serve` with its file).
#[derive(Debug, Default, Clone)]
pub struct MountRequest {
    /// The data set (a directory or an object store URL), if given here
    /// rather than as `source` in the file.
    pub source: Option<PathBuf>,
    /// Where to mount, if given here rather than as `mountpoint` in the file.
    pub mountpoint: Option<PathBuf>,
    /// The options given as flags (they win over `-o` and the file).
    pub flags: MountFlags,
    /// `--config FILE`: the TOML file to read (else `-o config=FILE`).
    pub config: Option<PathBuf>,
    /// Every `-o OPTIONS` as given, comma separated fstab-style options.
    pub o: Vec<String>,
}

/// The options of a mount that can come from flags, -o or the TOML file:
/// each field is the option of the same name (`cache_dir`: `--cache-dir`,
/// `cache-dir` in the file, `cache_dir` in -o), whose help text
/// (`locafs mount --help`) says what it means and its default. None, or
/// false: not given (then the other places, then the default, count).
#[derive(Debug, Default, Deserialize, serde::Serialize, Clone)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct MountFlags {
    pub cache_dir: Option<PathBuf>,
    pub cache_size: Option<Size>,
    pub cache_free_floor: Option<f64>,
    pub block_size: Option<Size>,
    pub memory_cache: Option<Size>,
    pub revalidate: Option<Span>,
    #[serde(default)]
    pub immutable: bool,
    #[serde(default)]
    pub no_passthrough: bool,
    /// `passthrough` or `kernel` ([`OpenMode`], parsed by `resolve`).
    pub open_mode: Option<String>,
    pub source_timeout: Option<Span>,
    pub metadata_timeout: Option<Span>,
    pub fuse_threads: Option<usize>,
    pub watchdog: Option<Span>,
    pub dataset_id: Option<String>,
    #[serde(default)]
    pub no_readahead: bool,
    pub readahead_window: Option<Size>,
    pub kernel_readahead: Option<Size>,
    pub prefetch_memory: Option<Size>,
    pub prefetch_jobs: Option<crate::read::concurrency::Jobs>,
    pub prefetch_bandwidth: Option<Size>,
    pub log_format: Option<LogFormat>,
    pub log_file: Option<PathBuf>,
    pub metrics: Option<String>,
    pub listen: Option<String>,
    pub peers: Option<String>,
    pub cluster_secret_file: Option<PathBuf>,
    pub peer_ca: Option<PathBuf>,
    pub peer_cert: Option<PathBuf>,
    pub peer_key: Option<PathBuf>,
    pub peer_timeout: Option<Span>,
    pub endpoint: Option<String>,
    pub region: Option<String>,
    #[serde(default)]
    pub no_sign_request: bool,
    pub profile: Option<String>,
}

/// How opens of files are served (`--open-mode`).
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub enum OpenMode {
    /// Every open and close reaches the daemon; fully cached files are
    /// handed to the kernel by FUSE passthrough.
    #[default]
    Passthrough,
    /// The kernel opens files by itself (no OPEN/RELEASE requests) and keeps
    /// their page cache across opens; no passthrough.
    Kernel,
}

impl std::str::FromStr for OpenMode {
    type Err = UsageError;

    fn from_str(s: &str) -> Result<Self, UsageError> {
        match s.trim() {
            "passthrough" => Ok(OpenMode::Passthrough),
            "kernel" => Ok(OpenMode::Kernel),
            _ => Err(usage(format!(
                "--open-mode {s:?}: expected passthrough or kernel"
            ))),
        }
    }
}

/// A usage problem: exit status 2 and a one-line message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

fn usage(msg: impl Into<String>) -> UsageError {
    UsageError(msg.into())
}

/// Everything a mount needs, resolved and checked.
#[derive(Debug, Clone)]
pub struct MountConfig {
    /// The directory, or the normalized URL of an object data set.
    pub source: PathBuf,
    /// The object store, when the source is one (then `source` is its URL).
    pub object: Option<crate::source::object::ObjectSpec>,
    pub mountpoint: PathBuf,
    pub cache_dir: PathBuf,
    pub dataset_dir: PathBuf,
    /// The cache directory and the data set's directory in it, open and
    /// checked (`private_dir`): everything the mount keeps there is reached
    /// through these handles.
    pub cache: crate::sys::private_dir::PrivateDir,
    pub dataset: crate::sys::private_dir::PrivateDir,
    /// What resolving changed on disk, for the log (e.g. a cache of an
    /// older locafs made owner-only).
    pub notes: Vec<String>,
    /// Whether `resolve` made `dataset_dir` (a mount that then fails
    /// removes it again).
    pub dataset_dir_created: bool,
    pub cache_size: Option<u64>,
    /// --cache-free-floor, if given (percent of the cache disk).
    pub cache_free_floor: Option<f64>,
    pub block_size: u64,
    pub memory_cache: u64,
    /// Bytes of blocks that may wait to be written to the cache.
    pub write_queue: u64,
    /// Bytes of the loader's blocks that may wait for room in that queue.
    pub write_wait: u64,
    /// None: immutable.
    pub revalidate: Option<Duration>,
    pub passthrough: bool,
    pub open_mode: OpenMode,
    /// The mount's kernel read-ahead in bytes; 0: the kernel's default.
    pub kernel_readahead: u64,
    pub source_timeout: Duration,
    pub metadata_timeout: Duration,
    pub fuse_threads: usize,
    /// --watchdog; None: off.
    pub watchdog: Option<Duration>,
    pub readahead: crate::read::prefetch::ReadAheadConfig,
    pub log_format: LogFormat,
    pub log_file: Option<PathBuf>,
    /// Where to serve Prometheus metrics; None: off.
    pub metrics: Option<std::net::SocketAddr>,
    /// The data set's name (--dataset-id or derived from the source path);
    /// also the data set id peers must agree on.
    pub dataset_name: String,
    /// The peer cache, if --listen/--peers and its credentials were given.
    pub peer: Option<crate::peer::PeerConfig>,
}

impl MountFlags {
    /// Fills every option not set here from `other`.
    fn or(self, other: MountFlags) -> MountFlags {
        MountFlags {
            cache_dir: self.cache_dir.or(other.cache_dir),
            cache_size: self.cache_size.or(other.cache_size),
            cache_free_floor: self.cache_free_floor.or(other.cache_free_floor),
            block_size: self.block_size.or(other.block_size),
            memory_cache: self.memory_cache.or(other.memory_cache),
            revalidate: self.revalidate.or(other.revalidate),
            immutable: self.immutable || other.immutable,
            no_passthrough: self.no_passthrough || other.no_passthrough,
            open_mode: self.open_mode.or(other.open_mode),
            source_timeout: self.source_timeout.or(other.source_timeout),
            metadata_timeout: self.metadata_timeout.or(other.metadata_timeout),
            fuse_threads: self.fuse_threads.or(other.fuse_threads),
            watchdog: self.watchdog.or(other.watchdog),
            dataset_id: self.dataset_id.or(other.dataset_id),
            no_readahead: self.no_readahead || other.no_readahead,
            readahead_window: self.readahead_window.or(other.readahead_window),
            kernel_readahead: self.kernel_readahead.or(other.kernel_readahead),
            prefetch_memory: self.prefetch_memory.or(other.prefetch_memory),
            prefetch_jobs: self.prefetch_jobs.or(other.prefetch_jobs),
            prefetch_bandwidth: self.prefetch_bandwidth.or(other.prefetch_bandwidth),
            log_format: self.log_format.or(other.log_format),
            log_file: self.log_file.or(other.log_file),
            metrics: self.metrics.or(other.metrics),
            listen: self.listen.or(other.listen),
            peers: self.peers.or(other.peers),
            cluster_secret_file: self.cluster_secret_file.or(other.cluster_secret_file),
            peer_ca: self.peer_ca.or(other.peer_ca),
            peer_cert: self.peer_cert.or(other.peer_cert),
            peer_key: self.peer_key.or(other.peer_key),
            peer_timeout: self.peer_timeout.or(other.peer_timeout),
            endpoint: self.endpoint.or(other.endpoint),
            region: self.region.or(other.region),
            no_sign_request: self.no_sign_request || other.no_sign_request,
            profile: self.profile.or(other.profile),
        }
    }
}

/// Standard mount(8)/fstab options that mean nothing to locafs itself.
fn ignored_mount_option(k: &str) -> bool {
    matches!(
        k,
        "ro" | "defaults"
            | "auto"
            | "noauto"
            | "user"
            | "users"
            | "nouser"
            | "_netdev"
            | "nofail"
            | "allow_other"
            | "default_permissions"
            | "nodev"
            | "nosuid"
            | "noexec"
            | "exec"
            | "dev"
            | "suid"
            | "noatime"
            | "relatime"
            | "atime"
            | "nodiratime"
    ) || k.starts_with("x-")
        || k.starts_with("comment=")
}

/// The `config=FILE` of `-o` options, if any (the last one wins).
fn o_config(options: &[String]) -> Option<PathBuf> {
    options
        .iter()
        .flat_map(|o| o.split(','))
        .filter_map(|o| o.trim().strip_prefix("config="))
        .next_back()
        .map(PathBuf::from)
}

impl MountRequest {
    /// The TOML file to read: `--config`, else `-o config=FILE`.
    pub fn config_file(&self) -> Option<PathBuf> {
        self.config.clone().or_else(|| o_config(&self.o))
    }
}

/// Parses `-o a=b,c` options into flags (`config=FILE` is not a flag:
/// [`MountRequest::config_file`]).
pub fn parse_o(options: &[String]) -> Result<MountFlags, UsageError> {
    let mut table = toml::Table::new();
    let mut last_key = String::new();
    for opt in options.iter().flat_map(|o| o.split(',')) {
        let opt = opt.trim();
        if opt.is_empty() || ignored_mount_option(opt) || opt.starts_with("config=") {
            continue;
        }
        // peers=a:7070,b:7070: the entries after the first have no '='.
        if last_key == "peers" && !opt.contains('=') && opt.contains(':') {
            if let Some(toml::Value::String(list)) = table.get_mut("peers") {
                list.push(',');
                list.push_str(opt);
            }
            continue;
        }
        if opt == "rw" {
            return Err(usage("-o rw: locafs mounts are read-only"));
        }
        let (k, v) = match opt.split_once('=') {
            Some((k, v)) => (k.replace('_', "-"), toml::Value::String(v.to_owned())),
            None => (opt.replace('_', "-"), toml::Value::Boolean(true)),
        };
        let v = match k.as_str() {
            "prefetch-jobs" if v.as_str().is_some_and(|s| s.parse::<i64>().is_err()) => v,
            "fuse-threads" | "prefetch-jobs" => toml::Value::Integer(
                v.as_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| usage(format!("-o {opt}: expected a number")))?,
            ),
            "cache-free-floor" => toml::Value::Float(
                v.as_str()
                    .map(|s| s.trim_end_matches('%'))
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| usage(format!("-o {opt}: expected a percentage")))?,
            ),
            _ => v,
        };
        last_key = k.clone();
        table.insert(k, v);
    }
    flags_from(table, |msg| usage(format!("-o: {msg}")))
}

/// The flags of a TOML table (the file or `-o`). A size or duration that
/// does not parse is reported as `--KEY: why`, as on the command line; any
/// other problem through `other`.
fn flags_from(
    table: toml::Table,
    other: impl Fn(&str) -> UsageError,
) -> Result<MountFlags, UsageError> {
    let e = match MountFlags::deserialize(toml::Value::Table(table.clone())) {
        Ok(f) => return Ok(f),
        Err(e) => e,
    };
    let msg = e.message();
    if ParseError::is_message(msg) {
        // serde keeps only the message: find the key that gives it.
        for (k, v) in table {
            let one = toml::Table::from_iter([(k.clone(), v)]);
            if MountFlags::deserialize(toml::Value::Table(one)).is_err_and(|e| e.message() == msg) {
                return Err(usage(format!("--{k}: {msg}")));
            }
        }
    }
    Err(other(msg))
}

/// A TOML configuration file: the mount options, and optionally what to
/// mount where (so that one file describes a whole mount, as the systemd
/// unit `locafs@NAME` uses /etc/locafs/NAME.toml).
#[derive(Debug, Default)]
pub struct ConfigFile {
    pub source: Option<PathBuf>,
    pub mountpoint: Option<PathBuf>,
    pub flags: MountFlags,
}

/// Reads a TOML configuration file.
pub fn read_config_file(path: &Path) -> Result<MountFlags, UsageError> {
    read_config(path).map(|c| c.flags)
}

/// Reads a TOML configuration file, with its `source` and `mountpoint` keys.
pub fn read_config(path: &Path) -> Result<ConfigFile, UsageError> {
    let bad = |msg: &str| {
        usage(format!(
            "config file {}: {}",
            path.display(),
            msg.lines().next().unwrap_or("invalid")
        ))
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| usage(format!("config file {}: {e}", path.display())))?;
    let mut table: toml::Table = toml::from_str(&text).map_err(|e| bad(e.message()))?;
    let mut path_key = |k: &str| -> Result<Option<PathBuf>, UsageError> {
        match table.remove(k) {
            None => Ok(None),
            Some(toml::Value::String(s)) if !s.is_empty() => Ok(Some(PathBuf::from(s))),
            Some(_) => Err(bad(&format!("{k}: expected a path (a non-empty string)"))),
        }
    };
    let source = path_key("source")?;
    let mountpoint = path_key("mountpoint")?;
    let flags = flags_from(table, bad)?;
    Ok(ConfigFile {
        source,
        mountpoint,
        flags,
    })
}

/// Parses the --metrics address: HOST:PORT, or :PORT for all interfaces.
pub fn parse_listen_addr(s: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let full = match s.strip_prefix(':') {
        Some(port) => format!("0.0.0.0:{port}"),
        None => s.to_owned(),
    };
    full.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| format!("{s:?}: expected HOST:PORT (e.g. 127.0.0.1:9100) or :PORT"))
}

/// FUSE threads by default. Whatever the number of CPUs: a FUSE thread
/// serves a read from the local disk cache itself and waits for the disk
/// (and for the source on metadata). On this 2-CPU VM, 2 threads instead of
/// 8 served warm opens of small files 8% faster, but took the cold pass of
/// figure 4 from 1.95x to 2.2x direct and figure 2b in the kernel open mode
/// from 0.24 to 0.17.
const DEFAULT_FUSE_THREADS: usize = 8;
/// The watchdog's deadline when --watchdog is not given: far above any
/// answer a live server gives (its FUSE threads never wait on the source),
/// short against a training job's patience.
const DEFAULT_WATCHDOG: Duration = Duration::from_secs(30);

/// How long a metadata call may wait for the source. A healthy NFS server
/// answers a `stat` in well under 10 ms, and one under heavy load within a
/// second or two; 5 s leaves room for that, so a busy source is never taken
/// for a stalled one (that would fail uncached reads at once), while a
/// stalled source costs the first requests of an outage at most 5 s.
const DEFAULT_METADATA_TIMEOUT: Duration = Duration::from_secs(5);

/// The default cache directory for this user.
pub fn default_cache_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return PathBuf::from("/var/cache/locafs");
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("locafs");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/locafs"),
        // (Another user may have made this first: then it is refused, as
        // a cache directory that is not ours; `private_dir`.)
        None => {
            std::env::temp_dir().join(format!("locafs-cache-{}", crate::sys::private_dir::me()))
        }
    }
}

/// The cache subdirectory name of a data set: its last path component (for
/// humans) and a hash of its full path.
pub fn dataset_id(source: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let base: String = source
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(40)
        .collect();
    let h = blake3::hash(source.as_os_str().as_bytes());
    format!("{base}-{}", &h.to_hex()[..16])
}

/// The cache subdirectory name of an object data set: its last prefix
/// segment (or bucket) for humans, and a hash of its URL and endpoint, so
/// that the same URL finds the same cache at every mount.
pub fn object_dataset_id(spec: &crate::source::object::ObjectSpec) -> String {
    let last = spec.prefix.rsplit('/').next().filter(|s| !s.is_empty());
    let base = Path::new(last.unwrap_or(&spec.bucket));
    let id = dataset_id(base);
    let h = blake3::hash(spec.identity().as_bytes());
    let (name, _) = id.rsplit_once('-').unwrap_or((&id, ""));
    format!("{name}-{}", &h.to_hex()[..16])
}

/// Applies the AWS profile named by `flag` (`--profile`), else by
/// `AWS_PROFILE` in `env`, to an s3:// spec: its keys, and its region and
/// endpoint where the flags (already in `spec`) and the environment do not
/// set them (see `source::aws_profile`). A profile that is missing or needs
/// what locafs does not do is a usage error. `--profile` on gs:// or az://
/// is refused; `AWS_PROFILE` is ignored there.
fn apply_profile(
    spec: &mut crate::source::object::ObjectSpec,
    flag: Option<&str>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), UsageError> {
    use crate::source::aws_profile::{Files, Named};
    use crate::source::object::Scheme;
    if spec.scheme != Scheme::S3 {
        return match flag {
            Some(_) => Err(usage(format!(
                "{}: --profile is for s3:// only",
                spec.url()
            ))),
            None => Ok(()),
        };
    }
    let (name, named) = match (flag, env("AWS_PROFILE").filter(|p| !p.is_empty())) {
        (Some(n), _) => (n.to_owned(), Named::Flag),
        (None, Some(n)) => (n, Named::Env),
        (None, None) => return Ok(()),
    };
    if name.is_empty() {
        return Err(usage("--profile: an empty name"));
    }
    let profile = Files::from_env(env).load(&name, named).map_err(usage)?;
    let applied = profile.apply(env, spec.no_sign_request).map_err(usage)?;
    spec.keys = applied.keys;
    if spec.region.is_none() {
        spec.region = applied.region;
    }
    if spec.endpoint.is_none() {
        spec.endpoint = applied.endpoint;
    }
    Ok(())
}

/// Merges and checks everything; fails before anything is mounted.
pub fn resolve(args: &MountRequest) -> Result<MountConfig, UsageError> {
    resolve_for(args, false)
}

/// [`resolve`] for a mountpoint where a locafs mount is live (a takeover,
/// or a server restarted under its holder): the mountpoint itself is not
/// looked at (a request to it would wait on the server being replaced).
pub fn resolve_live(args: &MountRequest) -> Result<MountConfig, UsageError> {
    resolve_for(args, true)
}

/// The canonical source directory the request names (None for an object
/// store, or one that cannot be resolved): found without opening the
/// cache.
pub fn source_path(args: &MountRequest) -> Option<PathBuf> {
    let (_, source_arg, _) = merged(args).ok()?;
    if source_arg
        .to_str()
        .is_some_and(crate::source::object::is_object_url)
    {
        return None;
    }
    source_dir(&source_arg, DEFAULT_METADATA_TIMEOUT).ok()
}

/// Where [`resolve`] finds the data set's directory, told without opening
/// or making anything (None if it cannot be told): for a user who cannot
/// open a cache dir another user's mount holds, to be told what to do
/// (`supervisor::attach::unprivileged`).
pub fn dataset_dir_path(args: &MountRequest) -> Option<PathBuf> {
    let (f, _, _) = merged(args).ok()?;
    let id = match f.dataset_id.clone() {
        Some(id) => id,
        None => dataset_id(&source_path(args)?),
    };
    let cache_dir = f.cache_dir.clone().unwrap_or_else(default_cache_dir);
    Some(std::fs::canonicalize(cache_dir).ok()?.join(id))
}

/// What [`resolve`] merges: the flags over `-o` over the file, and SOURCE
/// and MOUNTPOINT as given (or from the file).
fn merged(args: &MountRequest) -> Result<(MountFlags, PathBuf, PathBuf), UsageError> {
    let file = match &args.config_file() {
        Some(p) => read_config(p)?,
        None => ConfigFile::default(),
    };
    let f = args.flags.clone().or(parse_o(&args.o)?).or(file.flags);
    let source_arg = args.source.clone().or(file.source).ok_or_else(|| {
        usage("missing SOURCE (give it on the command line or as source = \"...\" in --config)")
    })?;
    let mp = args.mountpoint.clone().or(file.mountpoint).ok_or_else(|| {
        usage("missing MOUNTPOINT (give it on the command line or as mountpoint = \"...\" in --config)")
    })?;
    Ok((f, source_arg, mp))
}

/// The options of a resolved mount as one TOML configuration file (every
/// option merged, SOURCE, MOUNTPOINT and the cache dir as resolved): what
/// the process holding a mount hands each server it starts, so that a
/// restarted server runs with exactly the options the mount was made with
/// (the user's file may have changed since).
pub fn serving_toml(args: &MountRequest, cfg: &MountConfig) -> Result<String, UsageError> {
    let (mut f, _, _) = merged(args)?;
    f.cache_dir = Some(cfg.cache_dir.clone());
    let mut table = toml::Table::try_from(&f).map_err(|e| usage(e.to_string()))?;
    let path = |p: &Path| toml::Value::String(p.to_string_lossy().into_owned());
    table.insert("source".into(), path(&cfg.source));
    table.insert("mountpoint".into(), path(&cfg.mountpoint));
    Ok(table.to_string())
}

/// [`resolve`], step by step; the checks fail in this order, and all but
/// the peer options' before the cache directory is opened (or made).
fn resolve_for(args: &MountRequest, live: bool) -> Result<MountConfig, UsageError> {
    let (f, source_arg, mp) = merged(args)?;
    let object = object_spec(&f, &source_arg)?;
    let (source_timeout, metadata_timeout) = timeouts(&f)?;
    let source = match &object {
        Some(spec) => PathBuf::from(spec.url()),
        None => source_dir(&source_arg, metadata_timeout)?,
    };
    let mountpoint = mountpoint_for(&mp, live)?;
    if object.is_none() && (source == mountpoint || mountpoint.starts_with(&source)) {
        return Err(usage(format!(
            "mountpoint {} is inside the source",
            mp.display()
        )));
    }
    if let Some(p) = f.cache_free_floor {
        if !(0.0..=90.0).contains(&p) {
            return Err(usage("--cache-free-floor: a percentage between 0 and 90"));
        }
    }
    let memory = Memory::of(&f)?;
    let serving = Serving::of(&f)?;
    let cache_size = cache_size(&f)?;
    let mut readahead = readahead(&f, &memory, serving.fuse_threads);
    let dirs = CacheDirs::open(&f, object.as_ref(), &source, &mountpoint)?;
    let mut peer = resolve_peer(&f)?;
    if let Some(p) = &mut peer {
        check_peer_timeout(p.timeout, source_timeout)?;
        // Replies to other nodes are block buffers too: a share of the
        // budget (docs/tuning.md), taken from read-ahead's.
        p.reply_memory = crate::peer::limits::reply_memory(memory.budget);
        readahead.memory = readahead
            .memory
            .saturating_sub(p.reply_memory)
            .max(2 * memory.block_size);
    }

    Ok(MountConfig {
        // Made by this call (not looked up beforehand: another mount may
        // make it in between, and then it is not this one's to remove).
        dataset_dir_created: dirs.dataset.created(),
        dataset_name: dirs.id,
        peer,
        source,
        object,
        mountpoint,
        cache_dir: dirs.cache.path().to_owned(),
        dataset_dir: dirs.dataset.path().to_owned(),
        cache: dirs.cache,
        dataset: dirs.dataset,
        notes: dirs.notes,
        cache_size,
        cache_free_floor: f.cache_free_floor,
        block_size: memory.block_size,
        memory_cache: memory.memory_cache,
        write_queue: memory.write_queue,
        write_wait: memory.write_wait,
        revalidate: (!f.immutable).then_some(f.revalidate.map_or(Duration::from_secs(60), |s| s.0)),
        passthrough: !f.no_passthrough,
        open_mode: serving.open_mode,
        kernel_readahead: f.kernel_readahead.map_or(4 << 20, |s| s.0),
        source_timeout,
        metadata_timeout,
        fuse_threads: serving.fuse_threads,
        watchdog: serving.watchdog,
        readahead,
        log_format: f.log_format.unwrap_or_default(),
        log_file: f.log_file,
        metrics: serving.metrics,
    })
}

/// The object store SOURCE names, if it is a URL: its spec with the
/// store options (--endpoint, --region, --no-sign-request, --profile)
/// applied; those options on a directory source are an error.
fn object_spec(
    f: &MountFlags,
    source_arg: &Path,
) -> Result<Option<crate::source::object::ObjectSpec>, UsageError> {
    let object = match source_arg.to_str() {
        Some(s) if crate::source::object::is_object_url(s) => {
            let mut spec = crate::source::object::ObjectSpec::parse(s).map_err(usage)?;
            spec.endpoint = f.endpoint.clone();
            spec.region = f.region.clone();
            spec.no_sign_request = f.no_sign_request;
            let env = |k: &str| std::env::var(k).ok();
            apply_profile(&mut spec, f.profile.as_deref(), &env)?;
            // (A profile's endpoint_url was checked where it was read.)
            if let Some(e) = &f.endpoint {
                crate::source::aws_profile::check_endpoint(e)
                    .map_err(|why| usage(format!("--endpoint {e} {why}")))?;
            }
            Some(spec)
        }
        _ => None,
    };
    if object.is_none()
        && (f.endpoint.is_some() || f.region.is_some() || f.no_sign_request || f.profile.is_some())
    {
        return Err(usage(
            "--endpoint, --region, --no-sign-request and --profile are for object-store \
             sources (s3://, gs://, az://)",
        ));
    }
    Ok(object)
}

/// --source-timeout and --metadata-timeout, checked.
fn timeouts(f: &MountFlags) -> Result<(Duration, Duration), UsageError> {
    let source_timeout = f.source_timeout.map_or(Duration::from_secs(120), |s| s.0);
    if source_timeout.is_zero() {
        return Err(usage("--source-timeout: must be more than 0"));
    }
    // The default never exceeds --source-timeout: a short source timeout
    // shortens it.
    let metadata_timeout = f
        .metadata_timeout
        .map_or(DEFAULT_METADATA_TIMEOUT.min(source_timeout), |s| s.0);
    if metadata_timeout.is_zero() || metadata_timeout > source_timeout {
        return Err(usage(format!(
            "--metadata-timeout: must be more than 0 and at most --source-timeout ({}s)",
            source_timeout.as_secs_f64()
        )));
    }
    Ok((source_timeout, metadata_timeout))
}

/// The mountpoint's path: checked, or for a live mount only made absolute
/// (a request to it would wait on the server being replaced).
fn mountpoint_for(mp: &Path, live: bool) -> Result<PathBuf, UsageError> {
    if live {
        crate::mount::dead_mount::table_path(mp)
            .ok_or_else(|| usage(format!("mountpoint {}: not a path", mp.display())))
    } else {
        check_mountpoint(mp)
    }
}

/// The block size and the shares of the memory budget (--prefetch-memory)
/// that are not read-ahead's.
struct Memory {
    block_size: u64,
    /// --prefetch-memory: every block buffer of the daemon.
    budget: u64,
    memory_cache: u64,
    write_queue: u64,
    write_wait: u64,
}

impl Memory {
    fn of(f: &MountFlags) -> Result<Memory, UsageError> {
        let block_size = f.block_size.map_or(1 << 20, |s| s.0);
        if !(4096..=(16 << 20)).contains(&block_size) || block_size % 4096 != 0 {
            return Err(usage(
                "--block-size: must be a multiple of 4KiB between 4KiB and 16MiB",
            ));
        }
        let budget = f.prefetch_memory.map_or(256 << 20, |s| s.0);
        if budget < 8 * block_size {
            return Err(usage(format!(
                "--prefetch-memory: at least 8 blocks ({}) are needed",
                crate::sys::units::format_size(8 * block_size)
            )));
        }
        let memory_cache = f.memory_cache.map_or(budget / 4, |s| s.0);
        if memory_cache > budget / 2 {
            return Err(usage("--memory-cache: at most half of --prefetch-memory"));
        }
        Ok(Memory {
            block_size,
            budget,
            memory_cache,
            write_queue: budget / 4,
            write_wait: budget / 8,
        })
    }
}

/// How the mount is served: opens, the metrics address, FUSE threads and
/// the watchdog.
struct Serving {
    open_mode: OpenMode,
    metrics: Option<std::net::SocketAddr>,
    fuse_threads: usize,
    /// None: off.
    watchdog: Option<Duration>,
}

impl Serving {
    fn of(f: &MountFlags) -> Result<Serving, UsageError> {
        let open_mode: OpenMode = f.open_mode.as_deref().unwrap_or("passthrough").parse()?;
        let metrics = f
            .metrics
            .as_deref()
            .map(|s| parse_listen_addr(s).map_err(|e| usage(format!("--metrics {e}"))))
            .transpose()?;
        let fuse_threads = f.fuse_threads.unwrap_or(DEFAULT_FUSE_THREADS);
        if !(1..=256).contains(&fuse_threads) {
            return Err(usage("--fuse-threads: must be between 1 and 256"));
        }
        let watchdog = f.watchdog.map_or(DEFAULT_WATCHDOG, |s| s.0);
        if !watchdog.is_zero() && watchdog < Duration::from_secs(2) {
            return Err(usage("--watchdog: 0 (off) or at least 2s"));
        }
        Ok(Serving {
            open_mode,
            metrics,
            fuse_threads,
            watchdog: (!watchdog.is_zero()).then_some(watchdog),
        })
    }
}

/// --cache-size, if given: at least room for the cache's fixed overhead
/// twice.
fn cache_size(f: &MountFlags) -> Result<Option<u64>, UsageError> {
    let cache_size = f.cache_size.map(|s| s.0);
    if let Some(c) = cache_size {
        let min = crate::cache::disk::FIXED_OVERHEAD * 2;
        if c < min {
            return Err(usage(format!(
                "--cache-size: {} is too small (at least {})",
                crate::sys::units::format_size(c),
                crate::sys::units::format_size(min)
            )));
        }
    }
    Ok(cache_size)
}

/// Read-ahead's configuration, with its share of the memory budget
/// (before the peers take theirs).
fn readahead(
    f: &MountFlags,
    memory: &Memory,
    fuse_threads: usize,
) -> crate::read::prefetch::ReadAheadConfig {
    let block_size = memory.block_size;
    let prefetch_jobs = f
        .prefetch_jobs
        .unwrap_or(crate::read::concurrency::Jobs::Auto);
    crate::read::prefetch::ReadAheadConfig {
        sequential: !f.no_readahead,
        epoch: !f.no_readahead,
        max_window: f.readahead_window.map_or(64 << 20, |s| s.0).max(block_size),
        // Loader reads in flight hold a block each (at most the kernel's 32
        // background requests plus one per FUSE thread): kept out of the
        // read-ahead share so that the whole stays within the budget.
        memory: (memory.budget - memory.memory_cache - memory.write_queue - memory.write_wait)
            .saturating_sub((32 + fuse_threads as u64) * block_size)
            .max(2 * block_size),
        jobs: prefetch_jobs,
        bandwidth: f.prefetch_bandwidth.map(|s| s.0).filter(|b| *b > 0),
        small_file: 4 * block_size,
        plan_ahead: 256,
    }
}

/// The data set's name and the cache directories, open ([`open_cache_dirs`]).
struct CacheDirs {
    /// --dataset-id, or derived from the source.
    id: String,
    cache: crate::sys::private_dir::PrivateDir,
    dataset: crate::sys::private_dir::PrivateDir,
    notes: Vec<String>,
}

impl CacheDirs {
    fn open(
        f: &MountFlags,
        object: Option<&crate::source::object::ObjectSpec>,
        source: &Path,
        mountpoint: &Path,
    ) -> Result<CacheDirs, UsageError> {
        let cache_dir = f.cache_dir.clone().unwrap_or_else(default_cache_dir);
        let id = f.dataset_id.clone().unwrap_or_else(|| match object {
            Some(spec) => object_dataset_id(spec),
            None => dataset_id(source),
        });
        if id.is_empty() || id.contains('/') || id.starts_with('.') {
            return Err(usage(format!("--dataset-id {id:?}: must be a plain name")));
        }
        let (cache, dataset, notes) = open_cache_dirs(&cache_dir, mountpoint, &id)?;
        Ok(CacheDirs {
            id,
            cache,
            dataset,
            notes,
        })
    }
}

/// The canonical path of an existing, empty directory with nothing
/// mounted on it.
fn check_mountpoint(mp: &Path) -> Result<PathBuf, UsageError> {
    let mountpoint = std::fs::canonicalize(mp)
        .map_err(|e| usage(format!("mountpoint {}: {}", mp.display(), short_io(&e))))?;
    if !mountpoint.is_dir() {
        return Err(usage(format!(
            "mountpoint {}: not a directory",
            mp.display()
        )));
    }
    if crate::sys::is_mountpoint(&mountpoint) {
        return Err(usage(format!(
            "mountpoint {}: something is already mounted there",
            mp.display()
        )));
    }
    match std::fs::read_dir(&mountpoint) {
        Ok(mut rd) => {
            if rd.next().is_some() {
                return Err(usage(format!("mountpoint {}: not empty", mp.display())));
            }
        }
        Err(e) => {
            return Err(usage(format!(
                "mountpoint {}: {}",
                mp.display(),
                short_io(&e)
            )))
        }
    }
    Ok(mountpoint)
}

/// The source directory, canonical, or why not. Like every other call into
/// the source it waits at most `--metadata-timeout`: a source on a hung
/// network file system would put the caller in uninterruptible sleep, so
/// the kernel is asked from a child process that is left behind if it
/// does not answer (`sys::canonical_dir_within`).
fn source_dir(arg: &Path, timeout: Duration) -> Result<PathBuf, UsageError> {
    use crate::sys::ProbeError;
    // Relative to where we are, without asking the source anything.
    let abs = std::path::absolute(arg)
        .map_err(|e| usage(format!("source {}: {}", arg.display(), short_io(&e))))?;
    crate::sys::canonical_dir_within(&abs, timeout).map_err(|e| {
        usage(match e {
            ProbeError::Timeout => format!(
                "source {}: did not answer within --metadata-timeout ({}s): is its file \
                 system (NFS server, FUSE daemon) hung?",
                arg.display(),
                timeout.as_secs_f64()
            ),
            ProbeError::Io(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
                format!("source {}: not a directory", arg.display())
            }
            ProbeError::Io(e) => format!("source {}: {}", arg.display(), short_io(&e)),
        })
    })
}

/// Marks a data set directory whose every entry was made owner-only (see
/// [`open_cache_dirs`]).
pub const OWNER_ONLY_MARK: &str = "owner-only";

/// Opens the cache directory (created 0700 if missing) and the data set's
/// directory in it, each checked (`private_dir`: ours, nobody else may
/// write, made owner-only), and makes sure the data set's directory is
/// writable. The first time a data set directory is seen by this version
/// (no [`OWNER_ONLY_MARK`] in it: a cache of an older locafs, whose
/// directories were 0755 and files 0644), everything in it is made
/// owner-only once; the files at the top of the cache directory (the
/// ledger) are at every start. Also what it changed, in words. Whether
/// this call made the data set's directory: `created()` of the second.
#[allow(clippy::type_complexity)]
pub fn open_cache_dirs(
    cache_dir: &Path,
    mountpoint: &Path,
    id: &str,
) -> Result<
    (
        crate::sys::private_dir::PrivateDir,
        crate::sys::private_dir::PrivateDir,
        Vec<String>,
    ),
    UsageError,
> {
    use crate::sys::private_dir::PrivateDir;
    // The path the admin gave may pass through symlinks (a link to the
    // cache disk); below it, nothing is followed.
    let cache = PrivateDir::open_root(cache_dir, true).map_err(|e| {
        usage(format!(
            "cache dir {}: {}",
            cache_dir.display(),
            short_io(&e)
        ))
    })?;
    let cache_dir = cache.path().to_owned();
    if cache_dir.starts_with(mountpoint) {
        return Err(usage(format!(
            "cache dir {} is inside the mountpoint",
            cache_dir.display()
        )));
    }
    let fail = |e: std::io::Error| {
        usage(format!(
            "cache dir {}: {}",
            cache_dir.display(),
            short_io(&e)
        ))
    };
    private_top_files(&cache);
    let dataset = cache.subdir(id, true).map_err(fail)?;
    let mut notes = Vec::new();
    for d in [&cache, &dataset] {
        if let Some(was) = d.made_private_from() {
            notes.push(format!(
                "{}: made owner-only (it was {was:04o})",
                d.path().display()
            ));
        }
    }
    match dataset.make_private_once(OWNER_ONLY_MARK) {
        Ok(Some(w)) if w.fixed + w.symlinks > 0 => notes.push(format!(
            "cache {}: made {} of {} entries owner-only and removed {} symlinks (once: a \
             cache of an older locafs)",
            dataset.path().display(),
            w.fixed,
            w.entries,
            w.symlinks
        )),
        Ok(_) => {}
        Err(e) => return Err(fail(e)),
    }
    let probe = ".write-test";
    dataset.create_file(probe).map_err(|e| {
        usage(format!(
            "cache dir {}: not writable: {}",
            cache_dir.display(),
            short_io(&e)
        ))
    })?;
    let _ = dataset.remove_file(probe);
    Ok((cache, dataset, notes))
}

/// Takes the group's and others' bits away from the files at the top of
/// the cache directory (the ledger and its lock, as an older locafs left
/// them: they name every data set's source).
fn private_top_files(cache: &crate::sys::private_dir::PrivateDir) {
    let me = crate::sys::private_dir::me();
    for e in cache.entries("").into_iter().flatten() {
        if e.kind != rustix::fs::FileType::RegularFile {
            continue;
        }
        let Ok(st) = cache.stat(&e.name) else {
            continue;
        };
        if st.st_uid == me && st.st_mode & 0o077 != 0 {
            if let Ok(f) = cache.open_file(&e.name, rustix::fs::OFlags::RDONLY) {
                let _ = rustix::fs::fchmod(&f, rustix::fs::Mode::from_raw_mode(st.st_mode & 0o700));
            }
        }
    }
}

/// Splits a --peers list into host:port entries, checking their syntax.
pub fn parse_peer_list(list: &str) -> Result<Vec<String>, UsageError> {
    let mut out = Vec::new();
    for p in list.split([',', ' ', '\n', '\t']).map(str::trim) {
        if p.is_empty() {
            continue;
        }
        let bad = || usage(format!("--peers: {p:?} is not host:port"));
        let (host, port) = p.rsplit_once(':').ok_or_else(bad)?;
        let port: u16 = port.parse().map_err(|_| bad())?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() || port == 0 || host.chars().any(|c| c.is_whitespace() || c == '/') {
            return Err(bad());
        }
        out.push(p.to_owned());
    }
    if out.is_empty() {
        return Err(usage("--peers: empty list"));
    }
    Ok(out)
}

/// The peer options, all or none: --listen and --peers, and either
/// --cluster-secret-file or --peer-ca, --peer-cert and --peer-key.
fn resolve_peer(f: &MountFlags) -> Result<Option<crate::peer::PeerConfig>, UsageError> {
    let pem = [&f.peer_ca, &f.peer_cert, &f.peer_key];
    if f.listen.is_none()
        && f.peers.is_none()
        && f.cluster_secret_file.is_none()
        && pem.iter().all(|p| p.is_none())
        && f.peer_timeout.is_none()
    {
        return Ok(None);
    }
    let any_pem = pem.iter().any(|p| p.is_some());
    if f.cluster_secret_file.is_some() && any_pem {
        return Err(usage(
            "--cluster-secret-file and --peer-ca/--peer-cert/--peer-key are two ways to \
             authenticate peers: give only one",
        ));
    }
    if any_pem {
        let missing: Vec<&str> = [
            (&f.peer_ca, "--peer-ca"),
            (&f.peer_cert, "--peer-cert"),
            (&f.peer_key, "--peer-key"),
        ]
        .iter()
        .filter(|(p, _)| p.is_none())
        .map(|(_, name)| *name)
        .collect();
        if !missing.is_empty() {
            return Err(usage(format!(
                "--peer-ca, --peer-cert and --peer-key go together: {} missing",
                missing.join(" and ")
            )));
        }
    }
    let (Some(listen), Some(peers)) = (&f.listen, &f.peers) else {
        return Err(usage(
            "the peer cache needs --listen, --peers and --cluster-secret-file (or --peer-ca, \
             --peer-cert and --peer-key) together",
        ));
    };
    let listen: std::net::SocketAddr = listen.trim().parse().map_err(|_| {
        usage(format!(
            "--listen {listen:?}: expected IP:PORT, e.g. 0.0.0.0:7070"
        ))
    })?;
    let peers = parse_peer_list(peers)?;
    let identity = match (
        &f.cluster_secret_file,
        &f.peer_ca,
        &f.peer_cert,
        &f.peer_key,
    ) {
        (Some(secret_file), ..) => {
            let secret = read_private(secret_file, "--cluster-secret-file").map_err(|e| {
                if std::fs::symlink_metadata(secret_file).is_err() {
                    usage(format!(
                        "{} (run `locafs secret --out FILE` once and copy the file to every node)",
                        e.0
                    ))
                } else {
                    e
                }
            })?;
            crate::peer::tls::ClusterIdentity::from_secret(&secret).map_err(|e| {
                usage(format!(
                    "--cluster-secret-file {}: {e}",
                    secret_file.display()
                ))
            })?
        }
        (None, Some(ca), Some(cert), Some(key)) => peer_identity_from_pem(ca, cert, key)?,
        _ => {
            return Err(usage(
                "the peer cache needs --listen, --peers and --cluster-secret-file (or \
                 --peer-ca, --peer-cert and --peer-key) together",
            ))
        }
    };
    let timeout = f.peer_timeout.map_or(Duration::from_secs(2), |s| s.0);
    if timeout.is_zero() || timeout > Duration::from_secs(600) {
        return Err(usage("--peer-timeout: must be between 1ms and 10min"));
    }
    Ok(Some(crate::peer::PeerConfig {
        listen,
        peers,
        identity,
        timeout,
        // Set by resolve() from --prefetch-memory.
        reply_memory: 0,
    }))
}

/// The content of a file that must be its owner's alone (the cluster
/// secret, the node's private key), refused as ssh refuses a private key:
/// whoever reads it can join the cluster and read every cached block from
/// any node (docs/security.md).
fn read_private(path: &Path, option: &str) -> Result<Vec<u8>, UsageError> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let fail = |e: std::io::Error| usage(format!("{option} {}: {}", path.display(), short_io(&e)));
    let mut f = std::fs::File::open(path).map_err(fail)?;
    let mode = f.metadata().map_err(fail)?.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(usage(format!(
            "{option} {}: the group or others may read it (mode {mode:04o}), and whoever reads \
             it can join the cluster and read every cached block; run: chmod 600 {}",
            path.display(),
            path.display()
        )));
    }
    let mut v = Vec::new();
    f.read_to_end(&mut v).map_err(fail)?;
    Ok(v)
}

/// A read may spend up to three `--peer-timeout`s on peers
/// (`peer::client::BUDGET`: asking at most two, waiting for a slow one)
/// before the source, all within `--source-timeout`: unless that budget is
/// well below it, a slow peer turns a healthy source into ETIMEDOUT.
fn check_peer_timeout(peer: Duration, source: Duration) -> Result<(), UsageError> {
    let n = crate::peer::client::BUDGET;
    if peer * n >= source {
        return Err(usage(format!(
            "--peer-timeout {peer:?}: a read may wait up to {n} x --peer-timeout for peers \
             before the source, so {n} x --peer-timeout must be below --source-timeout \
             ({source:?}), or a slow peer makes reads time out before the source is asked; \
             lower --peer-timeout or raise --source-timeout"
        )));
    }
    Ok(())
}

/// The identity from the admin's PEM files; errors name the file at fault.
fn peer_identity_from_pem(
    ca: &Path,
    cert: &Path,
    key: &Path,
) -> Result<crate::peer::tls::ClusterIdentity, UsageError> {
    use crate::peer::tls::{ClusterIdentity, PemFile, TlsError};
    let path_of = |file: PemFile| match file {
        PemFile::Ca => ca,
        PemFile::Cert => cert,
        PemFile::Key => key,
    };
    let read = |file: PemFile| {
        let path = path_of(file);
        if file == PemFile::Key {
            return read_private(path, file.option());
        }
        std::fs::read(path).map_err(|e| {
            usage(format!(
                "{} {}: {}",
                file.option(),
                path.display(),
                short_io(&e)
            ))
        })
    };
    let (ca_pem, cert_pem, key_pem) = (
        read(PemFile::Ca)?,
        read(PemFile::Cert)?,
        read(PemFile::Key)?,
    );
    ClusterIdentity::from_pem(&ca_pem, &cert_pem, &key_pem).map_err(|e| match e {
        TlsError::Pem { file, problem } => usage(format!(
            "{} {}: {problem}",
            file.option(),
            path_of(file).display()
        )),
        other => usage(format!("--peer-cert {}: {other}", cert.display())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn size(s: &str) -> Option<Size> {
        Some(s.parse().unwrap())
    }

    fn span(s: &str) -> Option<Span> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn o_options_map_to_flags() {
        let f = parse_o(&["ro,_netdev,nofail,x-systemd.automount,cache_dir=/x,cache_size=5G,immutable,fuse_threads=4".into()]).unwrap();
        assert_eq!(f.cache_dir.as_deref(), Some(Path::new("/x")));
        assert_eq!(f.cache_size, size("5G"));
        assert!(f.immutable);
        assert_eq!(f.fuse_threads, Some(4));
        assert!(parse_o(&["bogus=1".into()]).is_err());
        assert!(parse_o(&["rw".into()]).is_err());
    }

    #[test]
    fn prefetch_jobs_is_auto_or_a_number_from_o_and_file() {
        use crate::read::concurrency::Jobs;
        let f = parse_o(&["prefetch_jobs=auto".into()]).unwrap();
        assert_eq!(f.prefetch_jobs, Some(Jobs::Auto));
        let f = parse_o(&["prefetch_jobs=32".into()]).unwrap();
        assert_eq!(f.prefetch_jobs, Some(Jobs::Fixed(32)));
        assert!(parse_o(&["prefetch_jobs=lots".into()]).is_err());
        assert!(parse_o(&["prefetch_jobs=0".into()]).is_err());
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.toml");
        for (text, want) in [
            ("prefetch-jobs = \"auto\"\n", Jobs::Auto),
            ("prefetch-jobs = 16\n", Jobs::Fixed(16)),
        ] {
            std::fs::write(&p, text).unwrap();
            assert_eq!(read_config_file(&p).unwrap().prefetch_jobs, Some(want));
        }
        std::fs::write(&p, "prefetch-jobs = 5000\n").unwrap();
        assert!(read_config_file(&p).is_err());
    }

    #[test]
    fn open_mode_from_flags_o_and_file() {
        assert_eq!(
            "passthrough".parse::<OpenMode>().unwrap(),
            OpenMode::Passthrough
        );
        assert_eq!("kernel".parse::<OpenMode>().unwrap(), OpenMode::Kernel);
        assert_eq!(OpenMode::default(), OpenMode::Passthrough);
        for bad in ["", "Kernel", "direct", "kernel,"] {
            let e = bad.parse::<OpenMode>().unwrap_err().0;
            assert!(e.starts_with("--open-mode ") && !e.contains('\n'), "{e}");
            assert!(e.contains("expected passthrough or kernel"), "{e}");
        }
        let f = parse_o(&["cache_free_floor=7.5%,cache_size=1G".into()]).unwrap();
        assert_eq!(f.cache_free_floor, Some(7.5));
        assert!(parse_o(&["cache_free_floor=lots".into()]).is_err());
        let f = parse_o(&["ro,open_mode=kernel,cache_size=1G".into()]).unwrap();
        assert_eq!(f.open_mode.as_deref(), Some("kernel"));
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.toml");
        std::fs::write(&p, "open-mode = \"kernel\"\n").unwrap();
        let file = read_config_file(&p).unwrap();
        assert_eq!(file.open_mode.as_deref(), Some("kernel"));
        // Flags win over the file.
        let flags = MountFlags {
            open_mode: Some("passthrough".into()),
            ..Default::default()
        };
        assert_eq!(flags.or(file).open_mode.as_deref(), Some("passthrough"));
    }

    #[test]
    fn peer_options() {
        let f = parse_o(&["peers=a:7070,10.0.0.2:7070,cache_size=1G,listen=0.0.0.0:7070".into()])
            .unwrap();
        assert_eq!(f.peers.as_deref(), Some("a:7070,10.0.0.2:7070"));
        assert_eq!(f.listen.as_deref(), Some("0.0.0.0:7070"));
        assert_eq!(f.cache_size, size("1G"));
        assert_eq!(
            parse_peer_list("a:1, [::1]:7070 ,svc.ns.svc:7070").unwrap(),
            ["a:1", "[::1]:7070", "svc.ns.svc:7070"]
        );
        for bad in ["a", "a:", ":7070", "a:0", "a:99999", "", "a:b"] {
            assert!(parse_peer_list(bad).is_err(), "{bad}");
        }
        let d = tempfile::tempdir().unwrap();
        let weak = d.path().join("weak");
        write_private(&weak, "hunter2\n");
        let mut f = MountFlags {
            listen: Some("127.0.0.1:7070".into()),
            peers: Some("127.0.0.1:7070".into()),
            cluster_secret_file: Some(weak.clone()),
            ..Default::default()
        };
        let e = resolve_peer(&f).unwrap_err().0;
        assert!(e.contains("run `locafs secret --out FILE`"), "{e}");
        assert!(e.starts_with("--cluster-secret-file "), "{e}");
        f.cluster_secret_file = Some(d.path().join("missing"));
        assert!(resolve_peer(&f).is_err());
        write_private(&weak, &crate::peer::tls::generate_secret().unwrap());
        f.cluster_secret_file = Some(weak.clone());
        assert!(resolve_peer(&f).unwrap().is_some());
        // Readable by others: refused, with the chmod to run.
        use std::os::unix::fs::PermissionsExt;
        for mode in [0o640, 0o604, 0o644, 0o620] {
            std::fs::set_permissions(&weak, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = resolve_peer(&f).unwrap_err().0;
            assert!(
                e.contains("the group or others may read it")
                    && e.ends_with(&format!("run: chmod 600 {}", weak.display())),
                "{mode:o}: {e}"
            );
        }
        std::fs::set_permissions(&weak, std::fs::Permissions::from_mode(0o400)).unwrap();
        assert!(resolve_peer(&f).unwrap().is_some());
        f.listen = Some("nowhere:7070".into());
        assert!(resolve_peer(&f).unwrap_err().0.contains("--listen"));
        f.listen = None;
        assert!(resolve_peer(&f).is_err());
    }

    #[test]
    fn object_urls_resolve_to_a_spec_and_a_cache_id_stable_per_url_and_endpoint() {
        let d = tempfile::tempdir().unwrap();
        let mnt = d.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let req = |src: &str, o: &[&str]| MountRequest {
            source: Some(PathBuf::from(src)),
            mountpoint: Some(mnt.clone()),
            o: o.iter().map(|s| s.to_string()).collect(),
            flags: MountFlags {
                cache_dir: Some(d.path().join("cache")),
                ..Default::default()
            },
            ..Default::default()
        };
        let a = resolve(&req(
            "s3://b/img/train/",
            &["endpoint=http://10.0.0.5:9000"],
        ))
        .unwrap();
        let spec = a.object.clone().unwrap();
        assert_eq!(a.source, PathBuf::from("s3://b/img/train"));
        assert_eq!(spec.endpoint.as_deref(), Some("http://10.0.0.5:9000"));
        assert!(a.dataset_name.starts_with("train-"), "{}", a.dataset_name);
        // The same URL (however written) and endpoint: the same cache; the
        // region does not change it, another endpoint does.
        let b = resolve(&req(
            "s3://b//img/train",
            &["endpoint=http://10.0.0.5:9000,region=eu-west-1"],
        ))
        .unwrap();
        assert_eq!(a.dataset_dir, b.dataset_dir);
        let c = resolve(&req("s3://b/img/train", &[])).unwrap();
        assert_ne!(a.dataset_dir, c.dataset_dir);
        for (url, scheme) in [
            ("gs://g/x", crate::source::object::Scheme::Gcs),
            ("az://ctr/x", crate::source::object::Scheme::Azure),
        ] {
            let r = resolve(&req(url, &["no_sign_request"])).unwrap();
            let o = r.object.unwrap();
            assert_eq!(o.scheme, scheme);
            assert!(o.no_sign_request);
        }
        let e = resolve(&req("s3://b/x", &["endpoint=10.0.0.5:9000"])).unwrap_err();
        assert!(e.0.contains("http://"), "{}", e.0);
        let e = resolve(&req("s3://", &[])).unwrap_err();
        assert!(e.0.contains("no bucket"), "{}", e.0);
    }

    #[test]
    fn a_profile_fills_keys_region_and_endpoint_the_flags_leave_unset() {
        use crate::source::object::ObjectSpec;
        let d = tempfile::tempdir().unwrap();
        let config = d.path().join("config");
        std::fs::write(
            &config,
            "[profile minio]\naws_access_key_id = AKIAM\naws_secret_access_key = s\n\
             region = eu-west-3\nendpoint_url = http://10.0.0.5:9000\n\
             [profile role]\nrole_arn = arn:aws:iam::1:role/r\n",
        )
        .unwrap();
        let cfg = config.to_str().unwrap().to_owned();
        let creds = d.path().join("none").to_str().unwrap().to_owned();
        let env_with = |extra: &'static [(&'static str, &'static str)]| {
            let (cfg, creds) = (cfg.clone(), creds.clone());
            move |k: &str| match k {
                "AWS_CONFIG_FILE" => Some(cfg.clone()),
                "AWS_SHARED_CREDENTIALS_FILE" => Some(creds.clone()),
                _ => extra
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned()),
            }
        };
        let spec = |url: &str| ObjectSpec::parse(url).unwrap();

        let mut s = spec("s3://b/p");
        apply_profile(&mut s, Some("minio"), &env_with(&[])).unwrap();
        use crate::source::aws_profile::ProfileKeys;
        let Some(ProfileKeys::Static(k)) = &s.keys else {
            panic!("{:?}", s.keys)
        };
        assert_eq!(k.access_key_id, "AKIAM");
        assert_eq!(s.region.as_deref(), Some("eu-west-3"));
        assert_eq!(s.endpoint.as_deref(), Some("http://10.0.0.5:9000"));
        // The profile's endpoint names the data set, as --endpoint does.
        assert!(s.identity().ends_with("@ http://10.0.0.5:9000"));

        // The flags win.
        let mut s = spec("s3://b/p");
        s.region = Some("us-east-1".into());
        s.endpoint = Some("http://flag:1".into());
        apply_profile(&mut s, Some("minio"), &env_with(&[])).unwrap();
        assert_eq!(s.region.as_deref(), Some("us-east-1"));
        assert_eq!(s.endpoint.as_deref(), Some("http://flag:1"));

        // AWS_PROFILE: the same profile, its keys losing to the
        // environment's.
        let mut s = spec("s3://b/p");
        apply_profile(&mut s, None, &env_with(&[("AWS_PROFILE", "minio")])).unwrap();
        assert!(s.keys.is_some());
        let mut s = spec("s3://b/p");
        let env = env_with(&[("AWS_PROFILE", "minio"), ("AWS_ACCESS_KEY_ID", "AKIAENV")]);
        apply_profile(&mut s, None, &env).unwrap();
        assert!(s.keys.is_none());
        assert_eq!(s.region.as_deref(), Some("eu-west-3"));

        let e = apply_profile(&mut spec("s3://b/p"), Some("role"), &env_with(&[])).unwrap_err();
        assert!(e.0.starts_with("--profile role: role_arn (in "), "{}", e.0);
        let e = apply_profile(&mut spec("s3://b/p"), Some("nope"), &env_with(&[])).unwrap_err();
        assert!(e.0.contains("no such profile"), "{}", e.0);
        // Not for gs:// or az://; AWS_PROFILE is ignored there.
        let e = apply_profile(&mut spec("gs://b/p"), Some("minio"), &env_with(&[])).unwrap_err();
        assert!(e.0.contains("--profile is for s3:// only"), "{}", e.0);
        let mut s = spec("az://c/p");
        apply_profile(&mut s, None, &env_with(&[("AWS_PROFILE", "role")])).unwrap();
        assert!(s.keys.is_none());

        // -o profile=NAME and `profile = "NAME"` in the file are the flag.
        assert_eq!(
            parse_o(&["profile=minio,_netdev".into()])
                .unwrap()
                .profile
                .as_deref(),
            Some("minio")
        );
    }

    #[test]
    fn o_config_names_the_file_as_the_flag_does() {
        let d = tempfile::tempdir().unwrap();
        let (src, mnt, cache) = (d.path().join("s"), d.path().join("m"), d.path().join("c"));
        for p in [&src, &mnt] {
            std::fs::create_dir(p).unwrap();
        }
        let file = d.path().join("x.toml");
        std::fs::write(
            &file,
            format!(
                "source = \"{}\"\nmountpoint = \"{}\"\nblock-size = \"64KiB\"\nfuse-threads = 3\n",
                src.display(),
                mnt.display()
            ),
        )
        .unwrap();
        let other = d.path().join("y.toml");
        std::fs::write(&other, "block-size = \"128KiB\"\n").unwrap();
        let req = |config: Option<&Path>, o: &str| MountRequest {
            config: config.map(Path::to_owned),
            o: vec![format!("cache_dir={},{o}", cache.display())],
            ..Default::default()
        };
        // -o config=FILE: the file's keys, its source and mountpoint too.
        let o_file = format!("config={}", file.display());
        let c = resolve(&req(None, &o_file)).unwrap();
        assert_eq!((c.block_size, c.fuse_threads), (64 << 10, 3));
        assert_eq!(c.mountpoint, std::fs::canonicalize(&mnt).unwrap());
        // The other -o options win over the file's keys.
        let c = resolve(&req(None, &format!("{o_file},fuse_threads=5"))).unwrap();
        assert_eq!(c.fuse_threads, 5);
        // --config wins over -o config=.
        let mut r = req(Some(&other), &o_file);
        r.source = Some(src.clone());
        r.mountpoint = Some(mnt.clone());
        assert_eq!(resolve(&r).unwrap().block_size, 128 << 10);
        // A missing file is the same error either way.
        let e = resolve(&req(None, "config=/nonexistent.toml"))
            .unwrap_err()
            .0;
        assert!(e.starts_with("config file /nonexistent.toml"), "{e}");
    }

    #[test]
    fn metadata_timeout_defaults_to_5s_and_never_exceeds_the_source_timeout() {
        let d = tempfile::tempdir().unwrap();
        let (src, mnt, cache) = (d.path().join("s"), d.path().join("m"), d.path().join("c"));
        for p in [&src, &mnt] {
            std::fs::create_dir(p).unwrap();
        }
        let args = |meta: Option<&str>, source: Option<&str>| MountRequest {
            source: Some(src.clone()),
            mountpoint: Some(mnt.clone()),
            flags: MountFlags {
                cache_dir: Some(cache.clone()),
                metadata_timeout: meta.and_then(span),
                source_timeout: source.and_then(span),
                ..Default::default()
            },
            ..Default::default()
        };
        let got = |meta, source| resolve(&args(meta, source)).map(|c| c.metadata_timeout);
        assert_eq!(got(None, None).unwrap(), Duration::from_secs(5));
        assert_eq!(got(None, Some("3s")).unwrap(), Duration::from_secs(3));
        assert_eq!(got(Some("1s"), None).unwrap(), Duration::from_secs(1));
        for (meta, source) in [(Some("10s"), Some("4s")), (Some("0s"), None)] {
            let e = got(meta, source).unwrap_err().0;
            assert!(e.starts_with("--metadata-timeout"), "{e}");
        }
    }

    #[test]
    fn peer_timeout_must_leave_the_source_its_time_and_replies_share_the_budget() {
        let d = tempfile::tempdir().unwrap();
        let (src, mnt, cache) = (d.path().join("s"), d.path().join("m"), d.path().join("c"));
        for p in [&src, &mnt] {
            std::fs::create_dir(p).unwrap();
        }
        let secret = d.path().join("secret");
        write_private(&secret, &crate::peer::tls::generate_secret().unwrap());
        let args = |peer_timeout: Option<&str>, source_timeout: Option<&str>, peers: bool| {
            let mut opts = MountFlags {
                cache_dir: Some(cache.clone()),
                peer_timeout: peer_timeout.and_then(span),
                source_timeout: source_timeout.and_then(span),
                prefetch_memory: size("256M"),
                ..Default::default()
            };
            if peers {
                opts.listen = Some("127.0.0.1:7070".into());
                opts.peers = Some("127.0.0.1:7070".into());
                opts.cluster_secret_file = Some(secret.clone());
            }
            MountRequest {
                source: Some(src.clone()),
                mountpoint: Some(mnt.clone()),
                flags: opts,
                ..Default::default()
            }
        };
        // 3 x 41s and 3 x 40s are not below the default 120s
        // (peer::client::BUDGET is three timeouts).
        for (peer, source) in [
            (Some("41s"), None),
            (Some("40s"), None),
            (Some("2s"), Some("6s")),
        ] {
            let e = resolve(&args(peer, source, true)).unwrap_err().0;
            assert!(e.starts_with("--peer-timeout "), "{e}");
            assert!(e.contains("below --source-timeout"), "{e}");
        }
        for (peer, source) in [(None, None), (Some("39s"), None), (Some("2s"), Some("7s"))] {
            resolve(&args(peer, source, true)).unwrap();
        }
        // Replies to peers take an eighth of --prefetch-memory from
        // read-ahead's share; without peers read-ahead keeps it.
        let with = resolve(&args(None, None, true)).unwrap();
        let without = resolve(&args(None, None, false)).unwrap();
        let reply = with.peer.as_ref().unwrap().reply_memory;
        assert_eq!(reply, 32 << 20);
        assert_eq!(with.readahead.memory + reply, without.readahead.memory);
    }

    /// A CA and a node certificate and key signed by it, as PEM files in `d`.
    /// Writes a file only its owner may read (a secret, a key).
    fn write_private(p: &Path, text: &str) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(p, text).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    fn write_test_pki(d: &Path) -> (PathBuf, PathBuf, PathBuf) {
        use crate::peer::tls::test_pki::{node_cert, test_ca};
        let ca = test_ca("test CA");
        let (cert, key) = node_cert(&ca, "node1.example.com");
        let paths = (d.join("ca.pem"), d.join("node.pem"), d.join("node.key"));
        std::fs::write(&paths.0, &ca.pem).unwrap();
        std::fs::write(&paths.1, cert).unwrap();
        write_private(&paths.2, &key);
        paths
    }

    #[test]
    fn peer_certificate_options() {
        let d = tempfile::tempdir().unwrap();
        let (ca, cert, key) = write_test_pki(d.path());
        // From -o and from the TOML file.
        let f = parse_o(&[format!(
            "listen=127.0.0.1:7070,peers=a:7070,b:7070,peer_ca={},peer_cert={},peer_key={}",
            ca.display(),
            cert.display(),
            key.display()
        )])
        .unwrap();
        assert_eq!(f.peers.as_deref(), Some("a:7070,b:7070"));
        assert_eq!(f.peer_ca.as_deref(), Some(ca.as_path()));
        assert_eq!(f.peer_cert.as_deref(), Some(cert.as_path()));
        assert_eq!(f.peer_key.as_deref(), Some(key.as_path()));
        let toml = d.path().join("c.toml");
        std::fs::write(
            &toml,
            format!(
                "listen = \"127.0.0.1:7070\"\npeers = \"127.0.0.1:7070\"\npeer-ca = {:?}\n\
                 peer-cert = {:?}\npeer-key = {:?}\n",
                ca.display().to_string(),
                cert.display().to_string(),
                key.display().to_string()
            ),
        )
        .unwrap();
        let from_file = read_config_file(&toml).unwrap();
        assert_eq!(from_file.peer_key.as_deref(), Some(key.as_path()));
        let pc = resolve_peer(&from_file).unwrap().expect("peer config");
        assert!(!pc.identity.leaf_is_fresh());
        assert_eq!(pc.identity.cluster_id().len(), 16);
        // Flags fill in over the file: a secret on top of certificates is
        // two ways at once.
        let both = MountFlags {
            cluster_secret_file: Some(d.path().join("secret")),
            ..Default::default()
        }
        .or(from_file.clone());
        let e = resolve_peer(&both).unwrap_err().0;
        assert!(e.contains("give only one"), "{e}");
        // A partial set.
        let partial = MountFlags {
            peer_key: None,
            peer_cert: None,
            ..from_file.clone()
        };
        let e = resolve_peer(&partial).unwrap_err().0;
        assert!(e.contains("--peer-cert and --peer-key missing"), "{e}");
        let partial = MountFlags {
            listen: None,
            peers: None,
            cluster_secret_file: None,
            peer_ca: Some(ca.clone()),
            ..Default::default()
        };
        assert!(resolve_peer(&partial)
            .unwrap_err()
            .0
            .contains("go together"));
        // Certificates without --listen/--peers.
        let alone = MountFlags {
            listen: None,
            ..from_file.clone()
        };
        assert!(resolve_peer(&alone).unwrap_err().0.contains("--listen"));
        // Unreadable and wrong files name the option and the path.
        let missing = d.path().join("missing.pem");
        let e = resolve_peer(&MountFlags {
            peer_ca: Some(missing.clone()),
            ..from_file.clone()
        })
        .unwrap_err()
        .0;
        assert!(
            e.starts_with(&format!("--peer-ca {}: ", missing.display())),
            "{e}"
        );
        // The certificate is public: readable by all, refused as a key.
        let e = resolve_peer(&MountFlags {
            peer_key: Some(cert.clone()),
            ..from_file.clone()
        })
        .unwrap_err()
        .0;
        assert!(
            e.starts_with(&format!(
                "--peer-key {}: the group or others may read it",
                cert.display()
            )),
            "{e}"
        );
        let not_key = d.path().join("not-a-key.pem");
        write_private(&not_key, &std::fs::read_to_string(&cert).unwrap());
        let e = resolve_peer(&MountFlags {
            peer_key: Some(not_key.clone()),
            ..from_file.clone()
        })
        .unwrap_err()
        .0;
        assert_eq!(
            e.split(" (").next().unwrap(),
            format!("--peer-key {}: no private key found", not_key.display())
        );
        let e = resolve_peer(&MountFlags {
            peer_ca: Some(cert.clone()),
            ..from_file
        })
        .unwrap_err()
        .0;
        assert!(
            e.starts_with(&format!(
                "--peer-cert {}: peers would refuse it",
                cert.display()
            )),
            "{e}"
        );
    }

    #[test]
    fn a_bad_size_or_duration_names_its_option_from_o_and_the_file() {
        let e = parse_o(&["ro,cache_size=lots".into()]).unwrap_err().0;
        assert_eq!(
            e,
            format!(
                "--cache-size: {}",
                crate::sys::units::parse_size("lots").unwrap_err()
            )
        );
        let e = parse_o(&["immutable,revalidate=xx,cache_size=1G".into()])
            .unwrap_err()
            .0;
        assert!(e.starts_with("--revalidate: bad duration \"xx\""), "{e}");
        // Other problems are the -o's.
        let e = parse_o(&["cache_size".into()]).unwrap_err().0;
        assert_eq!(e, "-o: invalid type: boolean `true`, expected a string");
        let e = parse_o(&["bogus_opt=1G".into()]).unwrap_err().0;
        assert!(e.starts_with("-o: unknown field `bogus-opt`"), "{e}");
        let e = parse_o(&["log_format=xml".into()]).unwrap_err().0;
        assert!(e.starts_with("-o: unknown variant `xml`"), "{e}");

        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.toml");
        std::fs::write(&p, "immutable = true\nmetadata-timeout = \"5y\"\n").unwrap();
        let e = read_config(&p).unwrap_err().0;
        assert_eq!(
            e,
            "--metadata-timeout: bad duration \"5y\": unknown unit \"y\""
        );
        std::fs::write(&p, "revalidate = 5\n").unwrap();
        let e = read_config(&p).unwrap_err().0;
        assert_eq!(
            e,
            format!(
                "config file {}: invalid type: integer `5`, expected a string",
                p.display()
            )
        );
    }

    #[test]
    fn config_file_rejects_unknown_keys() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.toml");
        std::fs::write(&p, "cache-size = \"1G\"\nimmutable = true\n").unwrap();
        let f = read_config_file(&p).unwrap();
        assert_eq!(f.cache_size, size("1G"));
        std::fs::write(&p, "cache-sise = \"1G\"\n").unwrap();
        let e = read_config_file(&p).unwrap_err().0;
        assert!(e.contains("unknown field"), "{e}");
    }

    #[test]
    fn config_file_may_name_source_and_mountpoint() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c.toml");
        std::fs::write(
            &p,
            "source = \"/data/x\"\nmountpoint = \"/mnt/x\"\nmetrics = \":9100\"\n",
        )
        .unwrap();
        let c = read_config(&p).unwrap();
        assert_eq!(c.source.as_deref(), Some(Path::new("/data/x")));
        assert_eq!(c.mountpoint.as_deref(), Some(Path::new("/mnt/x")));
        assert_eq!(c.flags.metrics.as_deref(), Some(":9100"));
        std::fs::write(&p, "source = 3\n").unwrap();
        let e = read_config(&p).unwrap_err().0;
        assert!(e.contains("source: expected a path"), "{e}");
    }

    #[test]
    fn listen_addresses() {
        assert_eq!(
            parse_listen_addr(":9100").unwrap(),
            "0.0.0.0:9100".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("127.0.0.1:1").unwrap(),
            "127.0.0.1:1".parse().unwrap()
        );
        assert_eq!(
            parse_listen_addr("[::1]:9").unwrap(),
            "[::1]:9".parse().unwrap()
        );
        assert!(parse_listen_addr("9100").is_err());
        assert!(parse_listen_addr("127.0.0.1").is_err());
    }

    #[test]
    fn flags_override_file() {
        let a = MountFlags {
            cache_size: size("1G"),
            ..Default::default()
        };
        let b = MountFlags {
            cache_size: size("2G"),
            revalidate: span("5s"),
            ..Default::default()
        };
        let m = a.or(b);
        assert_eq!(m.cache_size, size("1G"));
        assert_eq!(m.revalidate, span("5s"));
    }
}
