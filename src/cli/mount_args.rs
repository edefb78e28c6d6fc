//! The arguments of `locafs mount` as clap reads them: SOURCE,
//! MOUNTPOINT, every option of a mount with the help text `--help` shows,
//! `--config`, `-o` and `--daemon`. [`MountArgs::into_request`] hands them
//! to the library as its plain [`MountRequest`], which `config::resolve`
//! merges (flags over `-o` over the file) and checks.
//!
//! It must never merge, default or check an option itself: the library
//! does that once for the flags, `-o` and the TOML file alike (help texts
//! state the defaults `config::resolve` applies).

use std::path::PathBuf;

use clap::builder::PossibleValue;
use clap::{Args, ValueEnum};

use crate::mount::config::{MountFlags, MountRequest};
use crate::obs::logging::LogFormat;
use crate::read::concurrency::Jobs;
use crate::sys::units::{Size, Span};

/// Arguments of `locafs mount`: what to mount (resolved by
/// `config::resolve`) and how to run.
#[derive(Args, Debug, Default)]
pub struct MountArgs {
    /// The data set: a directory, or an object store URL (s3://bucket/prefix,
    /// gs://bucket/prefix, az://container/prefix); read-only for locafs. May
    /// instead be given as `source = "..."` in the --config file.
    pub source: Option<PathBuf>,
    /// An existing, empty directory to mount on. May instead be given as
    /// `mountpoint = "..."` in the --config file.
    pub mountpoint: Option<PathBuf>,
    #[command(flatten)]
    pub flags: MountFlagArgs,
    /// Read options from this TOML file (keys as the long options above,
    /// and source and mountpoint); -o config=FILE says the same.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// fstab-style options, comma separated: every option above with `_`
    /// for `-` (cache_dir=DIR,cache_size=SIZE,immutable,...), and
    /// config=FILE for --config. Standard mount options (ro, _netdev,
    /// nofail, x-systemd.*, ...) are accepted and ignored.
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub o: Vec<String>,
    /// Return once the mount is live and keep serving it in the background.
    #[arg(long)]
    pub daemon: bool,
}

impl MountArgs {
    /// What to mount, for the library (`--daemon` is the caller's).
    pub fn into_request(self) -> MountRequest {
        MountRequest {
            source: self.source,
            mountpoint: self.mountpoint,
            flags: self.flags.into(),
            config: self.config,
            o: self.o,
        }
    }
}

/// The options of a mount as flags; `-o` and the TOML file name the same
/// options (the library's [`MountFlags`], which this becomes).
#[derive(Args, Debug, Default, Clone)]
pub struct MountFlagArgs {
    /// Cache directory; one subdirectory per data set, so mounts can share it.
    /// [default: /var/cache/locafs as root, else $XDG_CACHE_HOME/locafs]
    #[arg(long, value_name = "DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Most disk space the caches under --cache-dir may use together,
    /// counting everything they write but their index (e.g. 500G, 64MiB,
    /// 1.5T; G is GiB): one budget
    /// that every mount of that directory shares, kept in it. [default: set
    /// at the directory's first mount to 80% of (free space + what its caches
    /// hold), then kept]
    #[arg(long, value_name = "SIZE")]
    pub cache_size: Option<Size>,
    /// Free space kept on the cache disk, in percent of its size, whatever
    /// --cache-size says: when other programs fill the disk, the caches give
    /// space back. Kept in the cache directory, as the budget is. [default:
    /// the directory's; 5 at its first mount]
    #[arg(long, value_name = "PERCENT")]
    pub cache_free_floor: Option<f64>,
    /// Cache block size: the unit of caching, checksumming and fetching.
    /// [default: 1MiB]
    #[arg(long, value_name = "SIZE")]
    pub block_size: Option<Size>,
    /// Part of --prefetch-memory kept for recently read blocks (serves reads
    /// of parts of a block without re-reading it). [default: a quarter of
    /// --prefetch-memory]
    #[arg(long, value_name = "SIZE")]
    pub memory_cache: Option<Size>,
    /// How long metadata is trusted before it is checked against the source
    /// again: new, changed and deleted files show up within this time.
    /// [default: 60s]
    #[arg(long, value_name = "DURATION")]
    pub revalidate: Option<Span>,
    /// Trust the source never to change (no revalidation, longest kernel
    /// caching). [default: off]
    #[arg(long)]
    pub immutable: bool,
    /// Never use FUSE passthrough (serve every read through the daemon).
    /// [default: off: passthrough for fully cached files where the kernel
    /// and the privileges allow]
    #[arg(long)]
    pub no_passthrough: bool,
    /// How files are opened: `passthrough` or `kernel`. [default: passthrough]
    ///
    /// passthrough: every open and close is a request to the daemon, which
    /// hands fully cached files to the kernel (FUSE passthrough). kernel: no
    /// request per open; the kernel keeps a file's page cache across opens,
    /// so warm reads of many small files run at page-cache speed, but there
    /// is no passthrough: every read that misses the page cache goes through
    /// the daemon, and a file changed at the source shows at the next
    /// attribute refresh (--revalidate), also to descriptors opened before
    /// the change. See docs/tuning.md.
    #[arg(long, value_name = "MODE")]
    pub open_mode: Option<String>,
    /// Longest wait for the source on one read before it fails (ETIMEDOUT).
    /// [default: 120s]
    #[arg(long, value_name = "DURATION")]
    pub source_timeout: Option<Span>,
    /// Longest wait for the source on one metadata call (lookup, stat,
    /// listing, readlink, statfs). Past it, what the mount knows is answered
    /// (last known attributes and listings); the rest fails with ETIMEDOUT.
    /// A source that answers nothing for this long while a call waits is
    /// stalled: calls that need it fail at once until it answers again.
    /// [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub metadata_timeout: Option<Span>,
    /// Threads serving FUSE requests. [default: 8]
    #[arg(long, value_name = "N")]
    pub fuse_threads: Option<usize>,
    /// How long the serving process may leave requests unanswered (a
    /// deadlock, a SIGSTOP) before the process holding the mount kills it
    /// and starts another, which answers them. A source that stalls is not
    /// a hang (see --metadata-timeout). 0 turns the watchdog off.
    /// [default: 30s]
    #[arg(long, value_name = "DURATION")]
    pub watchdog: Option<Span>,
    /// Name of the data set's cache subdirectory. [default: derived from the
    /// source path]
    #[arg(long, value_name = "NAME")]
    pub dataset_id: Option<String>,
    /// Turn read-ahead off (within files and across the epoch's files).
    /// [default: off]
    #[arg(long)]
    pub no_readahead: bool,
    /// Largest sequential read-ahead window per open file. [default: 64MiB]
    #[arg(long, value_name = "SIZE")]
    pub readahead_window: Option<Size>,
    /// The kernel's own read-ahead on the mount (the read_ahead_kb of its
    /// bdi in /sys/class/bdi), which sets how large the reads that reach the
    /// daemon are: the kernel's 128 KiB default caps sequential reads served
    /// by the daemon at about a fifth of the disk's speed. 0 leaves the
    /// kernel's default. Needs root. [default: 4MiB]
    #[arg(long, value_name = "SIZE")]
    pub kernel_readahead: Option<Size>,
    /// One memory budget for every block buffer of the daemon: loader reads
    /// and read-ahead in flight, recently read blocks (--memory-cache) and
    /// blocks waiting to be written to the cache. [default: 256MiB]
    #[arg(long, value_name = "SIZE")]
    pub prefetch_memory: Option<Size>,
    /// Background fetches in flight at once (the epoch's unread files, the
    /// plan): `auto` tunes the number to the source as it answers (more
    /// while throughput rises, fewer when reads queue or fail; 4 to 256,
    /// within --prefetch-memory); a number fixes it. [default: auto]
    #[arg(long, value_name = "auto|N")]
    pub prefetch_jobs: Option<Jobs>,
    /// Bandwidth cap for background prefetch (bytes/s, e.g. 200M). [default: none]
    #[arg(long, value_name = "SIZE")]
    pub prefetch_bandwidth: Option<Size>,
    /// Log format on stderr (or in --log-file). [default: text]
    #[arg(long, value_enum)]
    pub log_format: Option<LogFormat>,
    /// Write logs to this file (with --daemon, logs are otherwise dropped).
    /// [default: stderr]
    #[arg(long, value_name = "FILE")]
    pub log_file: Option<PathBuf>,
    /// Serve Prometheus metrics (locafs_*) over HTTP on this address, e.g.
    /// 127.0.0.1:9100 or :9100 (all interfaces). [default: off]
    #[arg(long, value_name = "ADDR")]
    pub metrics: Option<String>,
    /// Serve and ask other nodes of the job on this UDP address (QUIC), e.g.
    /// 0.0.0.0:7070. Needs --peers, and --cluster-secret-file or
    /// --peer-ca/--peer-cert/--peer-key. [default: off]
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// The nodes of the job, comma separated host:port entries (IPs or DNS
    /// names; a name with several addresses, like a Kubernetes headless
    /// service, counts each; names are resolved again every few seconds).
    /// This node may be in the list. In -o: peers=a:7070,b:7070.
    #[arg(long, value_name = "LIST")]
    pub peers: Option<String>,
    /// File holding the cluster secret shared by all nodes of the job
    /// (make one with `locafs secret --out FILE`: nothing else is accepted);
    /// nodes without it get nothing.
    /// Alternative: --peer-ca, --peer-cert and --peer-key.
    #[arg(long, value_name = "FILE")]
    pub cluster_secret_file: Option<PathBuf>,
    /// Your own PKI instead of a cluster secret: PEM file of the CA
    /// certificate(s) that every node's certificate must chain to (names in
    /// the certificates are not checked). With --peer-cert and --peer-key.
    #[arg(long, value_name = "FILE")]
    pub peer_ca: Option<PathBuf>,
    /// PEM file of this node's certificate (then any intermediates), signed
    /// by --peer-ca, with extended key usages serverAuth and clientAuth (or
    /// none).
    #[arg(long, value_name = "FILE")]
    pub peer_cert: Option<PathBuf>,
    /// PEM file of this node's private key (PKCS#8, RSA or EC; unencrypted).
    #[arg(long, value_name = "FILE")]
    pub peer_key: Option<PathBuf>,
    /// Longest wait for one peer on one block before trying the next node or
    /// the source; also the longest a read waits for a block's owner that is
    /// listed but not reached yet (nodes starting together). [default: 2s]
    #[arg(long, value_name = "DURATION")]
    pub peer_timeout: Option<Span>,
    /// Object stores: the endpoint URL of an S3-compatible store (or of an
    /// emulator), e.g. http://10.0.0.5:9000; for gs:// the storage API's
    /// base URL; for az:// the account's blob URL, or with
    /// AZURE_STORAGE_USE_EMULATOR=true Azurite's (http://127.0.0.1:10000).
    /// Part of the data set's identity (its cache directory). [default: the
    /// provider's]
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// s3:// only: the bucket's region. [default: AWS_REGION or
    /// AWS_DEFAULT_REGION, else the --profile's region, else us-east-1]
    #[arg(long, value_name = "REGION")]
    pub region: Option<String>,
    /// Object stores: send requests unsigned (public buckets); no
    /// credentials are looked up. [default: off]
    #[arg(long)]
    pub no_sign_request: bool,
    /// s3:// only: an AWS named profile of ~/.aws/credentials and
    /// ~/.aws/config (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE): its
    /// static keys or credential_process, region and endpoint_url
    /// (--region and --endpoint win).
    /// Its keys win over AWS_ACCESS_KEY_ID. [default: AWS_PROFILE, whose
    /// keys lose to AWS_ACCESS_KEY_ID; else no profile]
    #[arg(long, value_name = "NAME")]
    pub profile: Option<String>,
}

impl From<MountFlagArgs> for MountFlags {
    /// Field for field: the one place besides the two structs that lists
    /// the options (a flag missing from `MountFlags` fails to compile here;
    /// one missing here, the test `every_flag_is_an_option_of_the_library`).
    fn from(a: MountFlagArgs) -> MountFlags {
        MountFlags {
            cache_dir: a.cache_dir,
            cache_size: a.cache_size,
            cache_free_floor: a.cache_free_floor,
            block_size: a.block_size,
            memory_cache: a.memory_cache,
            revalidate: a.revalidate,
            immutable: a.immutable,
            no_passthrough: a.no_passthrough,
            open_mode: a.open_mode,
            source_timeout: a.source_timeout,
            metadata_timeout: a.metadata_timeout,
            fuse_threads: a.fuse_threads,
            watchdog: a.watchdog,
            dataset_id: a.dataset_id,
            no_readahead: a.no_readahead,
            readahead_window: a.readahead_window,
            kernel_readahead: a.kernel_readahead,
            prefetch_memory: a.prefetch_memory,
            prefetch_jobs: a.prefetch_jobs,
            prefetch_bandwidth: a.prefetch_bandwidth,
            log_format: a.log_format,
            log_file: a.log_file,
            metrics: a.metrics,
            listen: a.listen,
            peers: a.peers,
            cluster_secret_file: a.cluster_secret_file,
            peer_ca: a.peer_ca,
            peer_cert: a.peer_cert,
            peer_key: a.peer_key,
            peer_timeout: a.peer_timeout,
            endpoint: a.endpoint,
            region: a.region,
            no_sign_request: a.no_sign_request,
            profile: a.profile,
        }
    }
}

/// `--log-format`'s values, as clap's `ValueEnum` derive would give them
/// (the library's [`LogFormat`] stays a plain type).
impl ValueEnum for LogFormat {
    fn value_variants<'a>() -> &'a [Self] {
        &[LogFormat::Text, LogFormat::Json]
    }

    fn to_possible_value(&self) -> Option<PossibleValue> {
        Some(PossibleValue::new(match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{ArgAction, Command};

    /// A value clap takes for an option whose value is called `name`.
    fn value_for(name: &str) -> &'static str {
        match name {
            "SIZE" => "1M",
            "DURATION" => "1s",
            "PERCENT" | "N" => "1",
            "auto|N" => "auto",
            "LOG_FORMAT" => "json",
            _ => "x",
        }
    }

    #[test]
    fn every_flag_is_an_option_of_the_library() {
        let cmd = MountFlagArgs::augment_args(Command::new("mount"));
        let mut seen = 0;
        for arg in cmd.get_arguments() {
            let Some(long) = arg.get_long() else { continue };
            let mut argv = vec!["mount".to_owned(), format!("--{long}")];
            let flag = matches!(arg.get_action(), ArgAction::SetTrue);
            if !flag {
                let name = arg.get_value_names().unwrap()[0].as_str();
                argv.push(value_for(name).to_owned());
            }
            let m = MountFlagArgs::augment_args(Command::new("mount"))
                .try_get_matches_from(&argv)
                .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
            let given = <MountFlagArgs as clap::FromArgMatches>::from_arg_matches(&m).unwrap();
            // The flag reaches the library's options, under its own name.
            let table = toml::Table::try_from(MountFlags::from(given)).unwrap();
            match table.get(long) {
                Some(toml::Value::Boolean(b)) => assert!(*b && flag, "--{long}"),
                Some(_) => assert!(!flag, "--{long}"),
                None => panic!("--{long} is lost on its way to MountFlags"),
            }
            seen += 1;
        }
        // (The other way round, every option of `MountFlags` is a flag:
        // `From` names each field.)
        assert!(seen > 30, "{seen} flags");
    }
}
