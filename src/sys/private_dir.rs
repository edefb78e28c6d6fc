//! Directories only their owner may touch, and everything below them reached
//! without following a symlink: the cache directory, each data set's
//! directory and everything locafs keeps in them (blocks, meta, index,
//! manifest, ledger, locks).
//!
//! A [`PrivateDir`] is an open directory handle, checked when it is opened:
//! a directory (a symlink to one is refused), owned by the user running
//! locafs, and writable by nobody else. Read or search bits for the group
//! or others are taken away (the directory is ours, and nobody else could
//! have put anything in it); so are write bits from an empty directory (a
//! fresh tmpfs is 1777: once it is 0700 and still empty, nothing was
//! planted). A directory another user owns, or that others may write and
//! that holds anything, is refused with a message saying what to run,
//! because anyone could have planted files or symlinks in it. Everything below a handle is
//! opened relative to it (`openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS`, or `openat` component by component with
//! `O_NOFOLLOW` where the kernel has no `openat2`), and created owner-only
//! whatever the umask: directories 0700, files 0600, given as the mode of
//! the creating call.
//!
//! [`PrivateDir::make_private`] is the one-time walk that makes a cache of
//! an older locafs (directories 0755, files 0644) owner-only, and refuses
//! one holding an entry that another user owns.
//!
//! A leaf: imports nothing from the crate. It must never follow a symlink
//! below a handle, create anything the group or others can read, or hand
//! out a handle on a directory that failed its check.

use std::ffi::{CStr, OsStr, OsString};
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};

/// Mode of every directory locafs creates.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file locafs creates.
pub const FILE_MODE: u32 = 0o600;

/// Whether the kernel refused `openat2` once (older than Linux 5.6, or a
/// seccomp profile that does not know it): then paths are walked one
/// component at a time.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);

/// An open directory that passed the check (see the module's doc); cheap to
/// clone (one descriptor, shared).
#[derive(Clone)]
pub struct PrivateDir {
    fd: Arc<OwnedFd>,
    path: Arc<Path>,
    /// Its mode before the check made it owner-only, if it did.
    was: Option<u32>,
    /// Made by the call that opened it.
    created: bool,
}

impl std::fmt::Debug for PrivateDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PrivateDir({})", self.path.display())
    }
}

/// One entry of a directory.
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: OsString,
    pub kind: FileType,
}

/// What [`PrivateDir::make_private`] changed.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Walked {
    /// Directories and files looked at.
    pub entries: u64,
    /// Of them, those whose group or other bits were taken away.
    pub fixed: u64,
    /// Symlinks removed (locafs never makes one in its cache).
    pub symlinks: u64,
}

/// The user locafs runs as (the owner every checked directory must have).
pub fn me() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn refused(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, msg)
}

/// `e`, or, when it comes of a symlink (ELOOP, or ENOTDIR for a directory
/// that is a symlink: `is_link` says), a message saying so.
fn with_path(path: &Path, e: io::Error, is_link: impl FnOnce() -> bool) -> io::Error {
    let link = match e.raw_os_error() {
        Some(libc::ELOOP) => true,
        Some(libc::ENOTDIR) => is_link(),
        _ => false,
    };
    if link {
        return refused(format!(
            "{} is a symlink: locafs never makes one there, and never follows one; remove it",
            path.display()
        ));
    }
    e
}

/// Refuses a directory that another user owns or that others may write,
/// and takes the group's and others' read and search bits away from one we
/// own (then its mode before). `path` names it in messages.
fn check(fd: BorrowedFd<'_>, path: &Path) -> io::Result<Option<u32>> {
    let st = rustix::fs::fstat(fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Err(refused(format!("{}: not a directory", path.display())));
    }
    let me = me();
    let mode = st.st_mode & 0o7777;
    if st.st_uid != me {
        return Err(refused(format!(
            "{} belongs to uid {}, not to uid {me} who runs locafs: another user could have \
             put files or symlinks in it. Use another directory, or, if you trust what it \
             holds: chown -R {me} {} && chmod -R go-rwx {}",
            path.display(),
            st.st_uid,
            path.display(),
            path.display()
        )));
    }
    if mode & 0o022 != 0 {
        // Empty, nobody planted anything in it (a fresh tmpfs is 1777):
        // once it is 0700 nobody can, so it is taken, if it is still empty
        // then. Otherwise it is left as it is.
        if entries_of(fd)?.is_empty() {
            rustix::fs::fchmod(fd, Mode::from_raw_mode(mode & 0o700))?;
            if entries_of(fd)?.is_empty() {
                return Ok(Some(mode));
            }
            rustix::fs::fchmod(fd, Mode::from_raw_mode(mode))?;
        }
        return Err(refused(format!(
            "{} is writable by {} (mode {mode:04o}): anyone could have put files or symlinks \
             in it. Use another directory, or, if you trust what it holds: chmod -R go-rwx {}",
            path.display(),
            if mode & 0o002 != 0 {
                "every user"
            } else {
                "its group"
            },
            path.display()
        )));
    }
    if mode & 0o077 != 0 {
        rustix::fs::fchmod(fd, Mode::from_raw_mode(mode & !0o077))?;
        return Ok(Some(mode));
    }
    Ok(None)
}

/// A relative path's components, refusing anything that leaves the
/// directory (`..`, an absolute path).
fn components(rel: &Path) -> io::Result<Vec<&OsStr>> {
    let mut v = Vec::new();
    for c in rel.components() {
        match c {
            Component::Normal(n) => v.push(n),
            Component::CurDir => {}
            _ => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: not a path below the directory", rel.display()),
                ))
            }
        }
    }
    Ok(v)
}

/// A directory to act in: the handle itself or one below it.
enum At<'a> {
    Here(BorrowedFd<'a>),
    Below(OwnedFd),
}

impl At<'_> {
    fn fd(&self) -> BorrowedFd<'_> {
        match self {
            At::Here(fd) => *fd,
            At::Below(fd) => fd.as_fd(),
        }
    }
}

impl PrivateDir {
    /// Opens directory `path`, creating it (0700; missing parents with the
    /// default mode) if it does not exist, and checks it: [`Self::open_root`]
    /// with `create`.
    pub fn create(path: &Path) -> io::Result<PrivateDir> {
        Self::open_root(path, true)
    }

    /// Opens the directory `path` an admin named (a cache directory): with
    /// `create`, creates it (0700; missing parents with the default mode)
    /// if it does not exist. `path` may pass through symlinks (a link to
    /// the cache disk): it is resolved first, and what it names opened and
    /// checked ([`Self::path`] is then the resolved path); below it,
    /// nothing is followed. [`Self::created`] says whether this call made
    /// it.
    pub fn open_root(path: &Path, create: bool) -> io::Result<PrivateDir> {
        let mut created = false;
        if create {
            if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)?;
            }
            match rustix::fs::mkdir(path, Mode::from_raw_mode(DIR_MODE)) {
                Ok(()) => created = true,
                Err(rustix::io::Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let real = std::fs::canonicalize(path)?;
        let mut dir = Self::open(&real)?;
        dir.created = created;
        Ok(dir)
    }

    /// Opens the existing directory `path` (its last component must not be
    /// a symlink) and checks it.
    pub fn open(path: &Path) -> io::Result<PrivateDir> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            with_path(path, e.into(), || {
                std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
            })
        })?;
        let was = check(fd.as_fd(), path)?;
        Ok(PrivateDir {
            fd: Arc::new(fd),
            path: Arc::from(path),
            was,
            created: false,
        })
    }

    /// Whether the call that opened it created it ([`Self::open_root`],
    /// [`Self::subdir`] with `create`).
    pub fn created(&self) -> bool {
        self.created
    }

    /// Its mode before opening it made it owner-only (None: it was).
    pub fn made_private_from(&self) -> Option<u32> {
        self.was
    }

    /// The directory's path, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `rel`'s path, for messages.
    pub fn display(&self, rel: impl AsRef<Path>) -> PathBuf {
        self.path.join(rel)
    }

    /// The subdirectory `rel`, created (0700) if `create` and missing, and
    /// checked.
    pub fn subdir(&self, rel: impl AsRef<Path>, create: bool) -> io::Result<PrivateDir> {
        let rel = rel.as_ref();
        let path = self.path.join(rel);
        let mut created = false;
        if create {
            match self.mkdir(rel) {
                Ok(()) => created = true,
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(with_path(&path, e, || self.is_link(rel))),
            }
        }
        let fd = self
            .resolve(rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())
            .map_err(|e| with_path(&path, e, || self.is_link(rel)))?;
        let was = check(fd.as_fd(), &path)?;
        Ok(PrivateDir {
            fd: Arc::new(fd),
            path: Arc::from(path),
            was,
            created,
        })
    }

    /// Opens `rel` with `flags` (never following a symlink; a created file
    /// is 0600).
    pub fn open_file(&self, rel: impl AsRef<Path>, flags: OFlags) -> io::Result<File> {
        let rel = rel.as_ref();
        let mode = if flags.contains(OFlags::CREATE) {
            Mode::from_raw_mode(FILE_MODE)
        } else {
            Mode::empty()
        };
        self.resolve(rel, flags, mode)
            .map(File::from)
            .map_err(|e| with_path(&self.path.join(rel), e, || self.is_link(rel)))
    }

    /// Opens `rel` for reading.
    pub fn open_read(&self, rel: impl AsRef<Path>) -> io::Result<File> {
        self.open_file(rel, OFlags::RDONLY)
    }

    /// Creates `rel` (0600), or truncates it, for writing.
    pub fn create_file(&self, rel: impl AsRef<Path>) -> io::Result<File> {
        self.open_file(rel, OFlags::WRONLY | OFlags::CREATE | OFlags::TRUNC)
    }

    /// The whole content of `rel`.
    pub fn read(&self, rel: impl AsRef<Path>) -> io::Result<Vec<u8>> {
        use std::io::Read;
        let mut f = self.open_read(rel)?;
        let mut v = Vec::new();
        f.read_to_end(&mut v)?;
        Ok(v)
    }

    /// Creates directory `rel` (0700).
    pub fn mkdir(&self, rel: impl AsRef<Path>) -> io::Result<()> {
        let (at, name) = self.parent(rel.as_ref())?;
        rustix::fs::mkdirat(at.fd(), name, Mode::from_raw_mode(DIR_MODE))?;
        Ok(())
    }

    /// Removes file `rel` (a symlink itself, never what it points to).
    pub fn remove_file(&self, rel: impl AsRef<Path>) -> io::Result<()> {
        let (at, name) = self.parent(rel.as_ref())?;
        rustix::fs::unlinkat(at.fd(), name, AtFlags::empty())?;
        Ok(())
    }

    /// Removes `rel` and everything below it, following no symlink.
    pub fn remove_tree(&self, rel: impl AsRef<Path>) -> io::Result<()> {
        let (at, name) = self.parent(rel.as_ref())?;
        remove_tree_at(at.fd(), name)
    }

    /// Renames `from` to `to` (both below this directory).
    pub fn rename(&self, from: impl AsRef<Path>, to: impl AsRef<Path>) -> io::Result<()> {
        let (a, an) = self.parent(from.as_ref())?;
        let (b, bn) = self.parent(to.as_ref())?;
        rustix::fs::renameat(a.fd(), an, b.fd(), bn)?;
        Ok(())
    }

    /// `rel`'s attributes (a symlink's own).
    pub fn stat(&self, rel: impl AsRef<Path>) -> io::Result<rustix::fs::Stat> {
        let (at, name) = self.parent(rel.as_ref())?;
        Ok(rustix::fs::statat(
            at.fd(),
            name,
            AtFlags::SYMLINK_NOFOLLOW,
        )?)
    }

    /// Whether `rel` exists (as anything, a symlink included).
    pub fn exists(&self, rel: impl AsRef<Path>) -> bool {
        self.stat(rel).is_ok()
    }

    fn is_link(&self, rel: &Path) -> bool {
        self.stat(rel)
            .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Symlink)
    }

    /// Whether `rel` is a directory (not a symlink to one).
    pub fn is_dir(&self, rel: impl AsRef<Path>) -> bool {
        self.stat(rel)
            .is_ok_and(|s| FileType::from_raw_mode(s.st_mode) == FileType::Directory)
    }

    /// The entries of directory `rel` ("" for this one), without `.` and
    /// `..`.
    pub fn entries(&self, rel: impl AsRef<Path>) -> io::Result<Vec<DirEntry>> {
        let rel = rel.as_ref();
        if components(rel)?.is_empty() {
            return entries_of(self.fd.as_fd());
        }
        let fd = self.resolve(rel, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty())?;
        entries_of(fd.as_fd())
    }

    /// Syncs the directory itself (its entries).
    pub fn sync(&self) -> io::Result<()> {
        rustix::fs::fsync(self.fd.as_fd())?;
        Ok(())
    }

    /// The file system's figures under this directory.
    pub fn statvfs(&self) -> io::Result<rustix::fs::StatVfs> {
        Ok(rustix::fs::fstatvfs(self.fd.as_fd())?)
    }

    /// The handle, for calls this type does not wrap.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Makes everything below this directory owner-only (a cache of an older
    /// locafs: directories 0755, files 0644): each subdirectory is checked as
    /// [`PrivateDir::open`] checks, each file loses its group and other bits,
    /// symlinks are removed. An entry another user owns, or a subdirectory
    /// others may write, stops it with an error naming the entry.
    pub fn make_private(&self) -> io::Result<Walked> {
        let mut w = Walked::default();
        make_private_at(self.fd.as_fd(), &self.path, &mut w)?;
        Ok(w)
    }

    /// [`PrivateDir::make_private`], once: not again after it has left the
    /// file `marker` (0600) in this directory. None if it had.
    pub fn make_private_once(&self, marker: &str) -> io::Result<Option<Walked>> {
        if self.exists(marker) {
            return Ok(None);
        }
        let w = self.make_private()?;
        self.create_file(marker)?;
        Ok(Some(w))
    }

    /// The directory holding `rel`'s last component, and that component.
    fn parent<'a>(&self, rel: &'a Path) -> io::Result<(At<'_>, &'a OsStr)> {
        let mut parts = components(rel)?;
        let Some(name) = parts.pop() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an empty path below the directory",
            ));
        };
        if parts.is_empty() {
            return Ok((At::Here(self.fd.as_fd()), name));
        }
        let parent: PathBuf = parts.iter().collect();
        let fd = self.resolve(&parent, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())?;
        Ok((At::Below(fd), name))
    }

    /// Opens `rel` below the handle with no symlink followed anywhere.
    fn resolve(&self, rel: &Path, flags: OFlags, mode: Mode) -> io::Result<OwnedFd> {
        let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let parts = components(rel)?;
        match parts.as_slice() {
            [] => Ok(rustix::fs::openat(self.fd.as_fd(), ".", flags, mode)?),
            // One component: O_NOFOLLOW is all it takes.
            [name] => Ok(rustix::fs::openat(self.fd.as_fd(), *name, flags, mode)?),
            _ => {
                if !NO_OPENAT2.load(Ordering::Relaxed) {
                    match rustix::fs::openat2(
                        self.fd.as_fd(),
                        rel,
                        flags,
                        mode,
                        ResolveFlags::BENEATH
                            | ResolveFlags::NO_SYMLINKS
                            | ResolveFlags::NO_MAGICLINKS,
                    ) {
                        Err(rustix::io::Errno::NOSYS) | Err(rustix::io::Errno::PERM) => {
                            NO_OPENAT2.store(true, Ordering::Relaxed);
                        }
                        r => return Ok(r?),
                    }
                }
                let (last, dirs) = parts.split_last().expect("two or more components");
                let mut cur: Option<OwnedFd> = None;
                for d in dirs {
                    let at = cur.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
                    cur = Some(rustix::fs::openat(
                        at,
                        *d,
                        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                        Mode::empty(),
                    )?);
                }
                let at = cur.as_ref().map_or(self.fd.as_fd(), |f| f.as_fd());
                Ok(rustix::fs::openat(at, *last, flags, mode)?)
            }
        }
    }
}

fn entries_of(fd: BorrowedFd<'_>) -> io::Result<Vec<DirEntry>> {
    let mut out = Vec::new();
    let mut dir = rustix::fs::Dir::read_from(fd)?;
    while let Some(e) = dir.read() {
        let e = e?;
        let name = e.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let kind = match e.file_type() {
            FileType::Unknown => rustix::fs::statat(fd, name, AtFlags::SYMLINK_NOFOLLOW)
                .map(|s| FileType::from_raw_mode(s.st_mode))
                .unwrap_or(FileType::Unknown),
            k => k,
        };
        out.push(DirEntry {
            name: OsStr::from_bytes(name.to_bytes()).to_owned(),
            kind,
        });
    }
    Ok(out)
}

fn remove_tree_at(at: BorrowedFd<'_>, name: &OsStr) -> io::Result<()> {
    let st = rustix::fs::statat(at, name, AtFlags::SYMLINK_NOFOLLOW)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        rustix::fs::unlinkat(at, name, AtFlags::empty())?;
        return Ok(());
    }
    {
        let fd = rustix::fs::openat(
            at,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        for e in entries_of(fd.as_fd())? {
            if e.kind == FileType::Directory {
                remove_tree_at(fd.as_fd(), &e.name)?;
            } else {
                match rustix::fs::unlinkat(fd.as_fd(), &*e.name, AtFlags::empty()) {
                    Ok(()) | Err(rustix::io::Errno::NOENT) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    rustix::fs::unlinkat(at, name, AtFlags::REMOVEDIR)?;
    Ok(())
}

fn make_private_at(fd: BorrowedFd<'_>, path: &Path, w: &mut Walked) -> io::Result<()> {
    let me = me();
    for e in entries_of(fd)? {
        let name: &OsStr = &e.name;
        let cname = std::ffi::CString::new(name.as_bytes()).map_err(io::Error::other)?;
        let cname: &CStr = &cname;
        w.entries += 1;
        match e.kind {
            FileType::Directory => {
                let sub = rustix::fs::openat(
                    fd,
                    cname,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )?;
                let p = path.join(name);
                if check(sub.as_fd(), &p)?.is_some() {
                    w.fixed += 1;
                }
                make_private_at(sub.as_fd(), &p, w)?;
            }
            FileType::Symlink => {
                rustix::fs::unlinkat(fd, cname, AtFlags::empty())?;
                w.symlinks += 1;
            }
            _ => {
                // The directory is checked: nobody else can swap the entry
                // between this stat and the chmod below.
                let st = rustix::fs::statat(fd, cname, AtFlags::SYMLINK_NOFOLLOW)?;
                if st.st_uid != me {
                    return Err(refused(format!(
                        "{} belongs to uid {}, not to uid {me} who runs locafs: another user \
                         put it there. Remove it, or, if you trust it: chown {me} {}",
                        path.join(name).display(),
                        st.st_uid,
                        path.join(name).display()
                    )));
                }
                let mode = st.st_mode & 0o7777;
                if mode & 0o077 != 0 && FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
                    rustix::fs::chmodat(
                        fd,
                        cname,
                        Mode::from_raw_mode(mode & !0o077),
                        AtFlags::empty(),
                    )?;
                    w.fixed += 1;
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn what_it_creates_is_owner_only_whatever_the_umask() {
        let d = tempfile::tempdir().unwrap();
        let old = rustix::process::umask(Mode::empty());
        let top = PrivateDir::create(&d.path().join("c")).unwrap();
        top.subdir("ds", true).unwrap();
        top.create_file("ds2").unwrap();
        top.subdir("ds", true).unwrap().create_file("x").unwrap();
        rustix::process::umask(old);
        assert_eq!(mode(&d.path().join("c")), 0o700);
        assert_eq!(mode(&d.path().join("c/ds")), 0o700);
        assert_eq!(mode(&d.path().join("c/ds2")), 0o600);
        assert_eq!(mode(&d.path().join("c/ds/x")), 0o600);
    }

    #[test]
    fn created_says_whether_this_call_made_the_directory() {
        let d = tempfile::tempdir().unwrap();
        let top = PrivateDir::open_root(&d.path().join("c"), true).unwrap();
        assert!(top.created());
        assert!(top.subdir("ds", true).unwrap().created());
        assert!(!top.subdir("ds", true).unwrap().created());
        assert!(!top.subdir("ds", false).unwrap().created());
        assert!(!PrivateDir::open_root(&d.path().join("c"), true)
            .unwrap()
            .created());
    }

    #[test]
    fn a_readable_directory_of_ours_is_fixed_a_writable_one_refused() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c");
        std::fs::create_dir(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        PrivateDir::open(&p).unwrap();
        assert_eq!(mode(&p), 0o700);
        // Writable by all but empty (a fresh tmpfs): taken.
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o1777)).unwrap();
        assert_eq!(
            PrivateDir::open(&p).unwrap().made_private_from(),
            Some(0o1777)
        );
        assert_eq!(mode(&p), 0o700);
        // Not empty: refused, and left as it was.
        std::fs::write(p.join("planted"), b"").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = PrivateDir::open(&p).unwrap_err();
        assert_eq!(mode(&p), 0o777);
        assert!(
            e.to_string().contains("writable by every user")
                && e.to_string().contains("chmod -R go-rwx"),
            "{e}"
        );
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o770)).unwrap();
        let e = PrivateDir::open(&p).unwrap_err();
        assert!(e.to_string().contains("writable by its group"), "{e}");
    }

    #[test]
    fn symlinks_are_never_followed_below_the_handle_nor_at_its_own_name() {
        let d = tempfile::tempdir().unwrap();
        let victim = d.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        let outside = d.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        let top = PrivateDir::create(&d.path().join("c")).unwrap();
        let ds = top.subdir("ds", true).unwrap();
        std::os::unix::fs::symlink(&victim, ds.display("lock")).unwrap();
        std::os::unix::fs::symlink(&outside, top.display("evil")).unwrap();
        std::os::unix::fs::symlink(&outside, top.display("ds/sub")).unwrap();
        // The last component, a middle one, and one at the top.
        let e = ds.create_file("lock").unwrap_err();
        assert!(e.to_string().contains("is a symlink"), "{e}");
        assert!(top.create_file("ds/lock").is_err());
        assert!(top.create_file("ds/sub/lock").is_err());
        assert!(top.subdir("evil", true).is_err());
        assert!(top.create_file("evil/lock").is_err());
        assert!(top.open_read("../victim").is_err());
        let e = PrivateDir::open(&top.display("evil")).unwrap_err();
        assert!(e.to_string().contains("is a symlink"), "{e}");
        // Removing a tree removes the links, not what they point to.
        top.remove_tree("ds").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep");
        assert!(outside.is_dir());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
    }

    #[test]
    fn the_walk_makes_an_old_cache_owner_only_and_removes_symlinks() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c");
        std::fs::create_dir_all(p.join("ds/blocks/00")).unwrap();
        std::fs::write(p.join("ds/blocks/00/a.data"), b"x").unwrap();
        std::fs::write(p.join("ds/lock"), b"1").unwrap();
        let target = d.path().join("target");
        std::fs::write(&target, b"t").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&target, p.join("ds/blocks/00/b.data")).unwrap();
        for (rel, m) in [
            ("", 0o755),
            ("ds", 0o755),
            ("ds/blocks", 0o755),
            ("ds/blocks/00", 0o755),
            ("ds/blocks/00/a.data", 0o644),
            ("ds/lock", 0o644),
        ] {
            std::fs::set_permissions(p.join(rel), std::fs::Permissions::from_mode(m)).unwrap();
        }
        let top = PrivateDir::open(&p).unwrap();
        let w = top.make_private().unwrap();
        assert_eq!(w.symlinks, 1);
        assert_eq!(w.fixed, 5, "{w:?}");
        for (rel, m) in [
            ("ds", 0o700),
            ("ds/blocks/00", 0o700),
            ("ds/blocks/00/a.data", 0o600),
            ("ds/lock", 0o600),
        ] {
            assert_eq!(mode(&p.join(rel)), m, "{rel}");
        }
        assert!(!p.join("ds/blocks/00/b.data").exists());
        assert_eq!(
            mode(&target),
            0o644,
            "what a symlink points to is untouched"
        );
        assert_eq!(top.make_private().unwrap().fixed, 0, "once is enough");
    }
}
