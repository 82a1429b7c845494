//! The file mechanics every `fs` backend shares: argument checks, the mapping of I/O errors
//! to the `fs` error codes, the read operations, and the two mutations (atomic write, edit)
//! performed through a handle to the target's parent directory ([`Target`]). A backend only
//! decides HOW that handle is obtained: ambiently ([`Target::ambient`]) or resolved beneath a
//! writable root ([`Target::beneath`]), which is what makes the sandbox fence race-free.
//!
//! Every read opens with `O_NONBLOCK | O_NOCTTY` and asks the opened descriptor what it is,
//! so a FIFO, socket or device is refused without ever blocking on it; [`read_lines`]
//! streams a page of lines whose size its caps bound, whatever the file's size.

use std::collections::HashMap;
use std::ffi::OsString;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::UNIX_EPOCH;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, OpenOptions};
use cordis_sdk::{Error, Result};
use dsh_fs_api::{codes, guard};
use dsh_fs_api::{
    line_cut_marker, Cut, DirEntry, Edited, Kind, Lines, ListDir, Listing, ReadLines, Stat, Written,
};
use dsh_sandbox::{Fence, PathSet, SandboxExecutionPolicy, SandboxMode};
use dsh_sandbox::{FileId, RootMoved};
use std::os::fd::AsFd;

/// Checks that `path` is usable: non-empty, without NUL bytes, absolute.
pub fn check_path(path: &Path) -> Result<()> {
    let raw = path.as_os_str();
    if raw.is_empty() {
        return Err(Error::invalid("the path is empty")
            .with_help("pass an absolute path, e.g. /home/me/project/notes.txt"));
    }
    if raw.as_encoded_bytes().contains(&0) {
        return Err(Error::invalid(format!(
            "the path {:?} contains a NUL byte",
            path.display().to_string()
        ))
        .with_help("remove the NUL byte; file names cannot contain it"));
    }
    if !path.is_absolute() {
        return Err(
            Error::invalid(format!("the path `{}` is relative", path.display())).with_help(
                "resolve it against the session's working directory and pass the absolute path",
            ),
        );
    }
    Ok(())
}

/// `true` when `e` is cap-std's refusal of a path that resolved outside its directory
/// handle (a symlink or `..` leading out). The OS's own EACCES/EPERM carry an errno; this
/// one does not.
pub fn is_escape(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::PermissionDenied && e.raw_os_error().is_none()
}

pub use dsh_fs_api::{sandbox_denied, sandbox_refused};

/// What a read may not reach: every process's own `/proc` entries, always, and under a
/// policy below `danger-full-access` its `denyRead`. Checked on what was opened (the real
/// path of the descriptor), so a symlink swapped in after a check cannot lead around it.
#[derive(Clone, Debug, Default)]
pub struct ReadDeny {
    denied: Option<(SandboxMode, PathSet)>,
}

impl ReadDeny {
    /// The read fence of `policy` (`None`: only the `/proc` rule).
    pub fn of(policy: Option<&SandboxExecutionPolicy>) -> ReadDeny {
        let denied = policy
            .filter(|p| p.mode != SandboxMode::DangerFullAccess && !p.deny_read.is_empty())
            .map(|p| (p.mode, PathSet::new(p.deny_read.iter().cloned())));
        ReadDeny { denied }
    }

    /// Refuses, before anything is opened, a read of a process's `/proc` entries named as
    /// such. Nothing is resolved here: what an alias leads to is checked on what was
    /// opened ([`ReadDeny::check`]), and a failed open is worded by
    /// [`ReadDeny::open_failed`].
    pub fn check_path(&self, path: &Path) -> Result<()> {
        refuse_process_entry(path, path)
    }

    /// The error for an open of `path` that failed with `e`. When `path` leads to a
    /// process's `/proc` entry (through a symlink or `..`), the refusal says so: the kernel
    /// refuses the open of another process's entries with a less clear error. Resolved
    /// only here, on the failure, so a read that opens costs no walk of its path.
    pub fn open_failed(&self, e: io::Error, op: &str, path: &Path) -> Error {
        if let Ok(real) = path.canonicalize() {
            if let Err(denied) = refuse_process_entry(&real, path) {
                return denied;
            }
        }
        io_error(e, op, path)
    }

    /// Refuses the read of `opened`, opened at `path`, when what it is denies it.
    pub fn check(&self, opened: &impl std::os::fd::AsFd, path: &Path) -> Result<()> {
        self.check_named(opened.as_fd(), None, None, path)
    }

    /// [`ReadDeny::check`] of `opened`, whose name is `name` when it is known without
    /// asking the kernel (a plain path opened following no link), else what its
    /// `/proc/self/fd` entry names.
    ///
    /// A file of a `proc` file system is also judged by where it lies in that file system,
    /// whatever its mount point: a `proc` mounted at `/host/proc`, or a process's directory
    /// bound as the root of a mount, is the same kernel object as `/proc` itself. When
    /// that cannot be told, the read is refused.
    fn check_named(
        &self,
        opened: std::os::fd::BorrowedFd<'_>,
        name: Option<&Path>,
        mount: Option<u64>,
        path: &Path,
    ) -> Result<()> {
        // Without `denyRead` only a process's `/proc` entries are refused, and only a file
        // of a `proc` file system can be one: anything else needs no name (the name asked
        // for was refused by [`ReadDeny::check_path`] before the open).
        let on_proc = on_procfs(opened, mount);
        if self.denied.is_none() && !on_proc {
            return Ok(());
        }
        let real = match name {
            Some(real) => std::borrow::Cow::Borrowed(real),
            None => std::borrow::Cow::Owned(
                fd_entry::link(opened)
                    .map_err(|e| io_error(e, "check what was opened at", path))?,
            ),
        };
        refuse_process_entry(&real, path)?;
        if on_proc {
            let inside = proc_position(opened, &real).ok_or_else(|| unplaced_proc_file(path))?;
            refuse_process_entry(&inside, path)?;
        }
        if let Some((mode, set)) = &self.denied {
            if let Some(rule) = set.covering(&real) {
                return Err(dsh_fs_api::read_denied(*mode, path, &rule));
            }
        }
        Ok(())
    }
}

/// Whether `opened` lies on a `proc` file system (any mount of one); yes when that cannot
/// be told, so the caller checks by name. `mount` is the unique id of its mount when
/// known ([`libc::STATX_MNT_ID_UNIQUE`], Linux 6.8: never used again while the system
/// runs): a mount found not to be `proc` is remembered
/// ([`NOT_PROC`]), and a file on it asks no `fstatfs`.
fn on_procfs(opened: std::os::fd::BorrowedFd<'_>, mount: Option<u64>) -> bool {
    use std::sync::atomic::Ordering::Relaxed;
    /// `PROC_SUPER_MAGIC`.
    const PROC: i64 = 0x9fa0;
    if let Some(id) = mount {
        if NOT_PROC.iter().any(|m| m.load(Relaxed) == id) {
            return false;
        }
    }
    // `f_type`'s width differs between targets.
    #[allow(clippy::unnecessary_cast)]
    let on_proc = rustix::fs::fstatfs(opened).map_or(true, |s| s.f_type as i64 == PROC);
    if let (false, Some(id)) = (on_proc, mount) {
        // The first free slot; when all are taken the mount is simply asked about again.
        let _ = NOT_PROC
            .iter()
            .find_map(|m| m.compare_exchange(0, id, Relaxed, Relaxed).ok());
    }
    on_proc
}

/// Mounts found not to be of a `proc` file system, by unique id (0: a free slot). A
/// unique mount id names one mount for as long as the system runs, and a mount's file
/// system never changes, so an entry never goes stale; a process reads files on a few
/// mounts, so a few slots are enough.
static NOT_PROC: [std::sync::atomic::AtomicU64; 8] =
    [const { std::sync::atomic::AtomicU64::new(0) }; 8];

/// Where `opened`, a file of a `proc` file system named `real`, lies in that file system,
/// spelled beneath `/proc`: the root of its mount (`/proc/self/mountinfo`, found by the
/// mount's id) joined with what of `real` lies below the mount point. `None` when that
/// cannot be told (no mount id, a mount gone since the open, a name outside its mount).
fn proc_position(opened: std::os::fd::BorrowedFd<'_>, real: &Path) -> Option<PathBuf> {
    use rustix::fs::{AtFlags, StatxFlags};
    let stat = rustix::fs::statx(opened, "", AtFlags::EMPTY_PATH, StatxFlags::MNT_ID).ok()?;
    if stat.stx_mask & StatxFlags::MNT_ID.bits() == 0 {
        return None;
    }
    let table = std::fs::read("/proc/self/mountinfo").ok()?;
    let mount = dsh_sandbox::mountinfo::mounts(&table).find(|m| m.id == stat.stx_mnt_id)?;
    let below = real.strip_prefix(&mount.point).ok()?;
    Some(
        Path::new("/proc")
            .join(mount.root.strip_prefix("/").ok()?)
            .join(below),
    )
}

/// The refusal of a read of a `proc` file system's file whose place in it cannot be told.
fn unplaced_proc_file(path: &Path) -> Error {
    Error::new(
        codes::FS_READ_DENIED,
        format!(
            "cannot read `{}`: it is a file of a `proc` file system, and where it lies in that file system (whether it is the entry of a process) could not be told",
            path.display()
        ),
    )
    .with_help("a process's own /proc entries are never served; other files of a proc file system are read where its mount is listed in /proc/self/mountinfo")
}

/// Refuses `real` (what `path` names) when it lies beneath a process's `/proc` entry.
fn refuse_process_entry(real: &Path, path: &Path) -> Result<()> {
    if let Some(entry) = process_entry(real) {
        return Err(Error::new(
                codes::FS_READ_DENIED,
                format!(
                    "cannot read `{}`: it is the `/proc` entry of a process (`{}`), which would reveal that process's environment, memory or open files",
                    path.display(),
                    entry.display()
                ),
            )
            .with_help("read the files themselves; a process's own /proc entries are never served"));
    }
    Ok(())
}

/// The per-process part of `real` (`/proc/<pid>`, `/proc/self`, `/proc/thread-self`), if
/// it lies beneath one.
fn process_entry(real: &Path) -> Option<PathBuf> {
    let rest = real.strip_prefix("/proc").ok()?;
    let first = rest.components().next()?.as_os_str().to_str()?;
    let per_process = first == "self"
        || first == "thread-self"
        || (!first.is_empty() && first.bytes().all(|b| b.is_ascii_digit()));
    per_process.then(|| Path::new("/proc").join(first))
}

pub use dsh_fs_api::io_error;

/// Canonicalizes an absolute path (the deepest existing ancestor is resolved).
pub fn resolve(path: &Path) -> Result<PathBuf> {
    check_path(path)?;
    dsh_sandbox::canonical_path(path).map_err(|e| io_error(e, "resolve", path))
}

/// Metadata of `path`, following symlinks.
pub fn stat(path: &Path) -> Result<Stat> {
    check_path(path)?;
    let m = std::fs::metadata(path).map_err(|e| io_error(e, "stat", path))?;
    let modified_ms = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as u64);
    Ok(Stat {
        kind: Kind::of(m.file_type()),
        size: m.len(),
        modified_ms,
    })
}

fn utf8(bytes: Vec<u8>, path: &Path) -> Result<String> {
    String::from_utf8(bytes).map_err(|e| {
        Error::new(
            codes::FS_NOT_TEXT,
            format!(
                "`{}` is not UTF-8 text (invalid byte at offset {})",
                path.display(),
                e.utf8_error().valid_up_to()
            ),
        )
        .with_help("only text files can be read or edited as text")
    })
}

/// The flags every read opens with: `O_NONBLOCK`, so opening a FIFO never waits for a
/// writer, and `O_NOCTTY`, so opening a terminal never makes it the controlling one. A
/// regular file reads the same with or without them.
const READ_FLAGS: rustix::fs::OFlags =
    rustix::fs::OFlags::NONBLOCK.union(rustix::fs::OFlags::NOCTTY);

/// How much of a file's start [`read_lines`] checks for binary content, whatever the offset.
pub const SNIFF_BYTES: usize = 8 * 1024;

/// What a file of type `t` is when it is not a regular file, for an error message.
fn not_regular_kind(t: std::fs::FileType) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    if t.is_file() {
        None
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_fifo() {
        Some("a FIFO (named pipe)")
    } else if t.is_socket() {
        Some("a socket")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else {
        Some("a special file")
    }
}

fn not_regular(path: &Path, op: &str, kind: &str) -> Error {
    let help = if kind == "a directory" {
        "list the directory instead, or name a file inside it".to_string()
    } else {
        format!(
            "only regular files can be read as text; {kind} may never end or never answer. \
             To look at it anyway, use a shell command with a bound, e.g. \
             `timeout 5 head -c 4096 '{}' | xxd`",
            path.display()
        )
    };
    Error::new(
        codes::FS_WRONG_KIND,
        format!(
            "cannot {op} `{}`: it is {kind}, not a regular file",
            path.display()
        ),
    )
    .with_help(help)
}

/// Opens `name` (relative to the directory `dirfd`, or to the current directory for
/// `AT_FDCWD`) for reading only if it is a regular file. It is looked at through an
/// `O_PATH` descriptor first, which opens nothing: a FIFO, a socket or a device is never
/// opened (no blocking, no side effect of a device's open), and what is read is the very
/// file whose type was checked (reopened through that descriptor). With `follow` false a
/// symbolic link at `name` is refused (`ELOOP`) rather than followed. Returns the file and
/// its reported size; an error of the lookup itself is `Err(io)` for the caller to word.
fn open_regular_at(
    dirfd: libc::c_int,
    name: &std::ffi::OsStr,
    follow: bool,
    path: &Path,
    op: &str,
) -> std::result::Result<Result<(std::fs::File, u64)>, io::Error> {
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::ffi::OsStrExt;
    let c_name = std::ffi::CString::new(name.as_bytes())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    // SAFETY: a valid C string and flags; the descriptor is owned at once.
    let fd = unsafe {
        libc::openat(
            dirfd,
            c_name.as_ptr(),
            libc::O_PATH | libc::O_CLOEXEC | nofollow,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    let handle = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let meta = handle.metadata()?;
    if meta.file_type().is_symlink() {
        return Err(io::Error::from_raw_os_error(libc::ELOOP));
    }
    if let Some(kind) = not_regular_kind(meta.file_type()) {
        return Ok(Err(not_regular(path, op, kind)));
    }
    let file = fd_entry::reopen(&handle, READ_FLAGS)?;
    Ok(Ok((file, meta.len())))
}

/// Opens `path` ambiently for reading unless `deny` refuses what it names or what was
/// opened; anything but a regular file is refused unopened. Returns the file and its
/// reported size.
///
/// A plain path ([`dsh_sandbox::plain_path`]) that names a regular file reached through
/// no symbolic link is opened straight ([`open_plain_regular`]): the file is then named by
/// the path itself, and the name is checked without asking the kernel for it. Any other
/// path (a link anywhere in it, a kernel without `openat2`, a missing file, anything but
/// a regular file) is opened with `O_PATH` following links, looked at, reopened for
/// reading only when regular, and what was opened is checked by the name the kernel
/// gives it ([`ReadDeny::check`]).
fn open_regular(path: &Path, op: &str, deny: &ReadDeny) -> Result<(std::fs::File, u64)> {
    deny.check_path(path)?;
    if let Some(real) = dsh_sandbox::plain_path(path) {
        if let Some(opened) = open_plain_regular(&real) {
            deny.check_named(
                std::os::fd::AsFd::as_fd(&opened.file),
                Some(&real),
                opened.mount,
                path,
            )?;
            return Ok((opened.file, opened.size));
        }
    }
    let (file, size) = match open_regular_at(libc::AT_FDCWD, path.as_os_str(), true, path, op) {
        Ok(opened) => opened?,
        Err(e) => return Err(deny.open_failed(e, op, path)),
    };
    deny.check(&file, path)?;
    Ok((file, size))
}

/// A regular file opened for reading by [`open_plain_regular`].
struct PlainOpened {
    file: std::fs::File,
    /// Its size as the file system reports it.
    size: u64,
    /// The unique id of its mount, where the kernel gives one ([`on_procfs`]).
    mount: Option<u64>,
}

/// `real`, an absolute plain path, opened for reading when it names a regular file
/// reached without following any symbolic link (magic links of `/proc` included); `None`
/// when it does not, when the kernel lacks `openat2`, or when what was opened is not what
/// the path named a moment before.
///
/// The path is looked at (`statx`, not following a link at its end) before anything is
/// opened, so a path naming anything but a regular file is never opened; the descriptor
/// is then compared with that look (device and inode), so a file swapped in between is
/// neither read nor kept (opening it cannot block: [`READ_FLAGS`]). One look, one open,
/// one `statx` of the descriptor: cheaper than an `O_PATH` open reopened through
/// `/proc/self/fd`, the long way the caller takes on `None`.
fn open_plain_regular(real: &Path) -> Option<PlainOpened> {
    use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, StatxFlags};
    let regular = |mode: u16| FileType::from_raw_mode(mode.into()) == FileType::RegularFile;
    let looked = rustix::fs::statx(
        rustix::fs::CWD,
        real,
        AtFlags::SYMLINK_NOFOLLOW,
        StatxFlags::TYPE | StatxFlags::INO,
    )
    .ok()?;
    if !regular(looked.stx_mode) {
        return None;
    }
    // The window a racing swap would use: looked at, nothing opened yet.
    #[cfg(test)]
    race::at(race::Point::Looked);
    let file = rustix::fs::openat2(
        rustix::fs::CWD,
        real,
        OFlags::RDONLY | OFlags::CLOEXEC | READ_FLAGS,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .ok()?;
    let opened = rustix::fs::statx(
        &file,
        "",
        AtFlags::EMPTY_PATH,
        StatxFlags::TYPE
            | StatxFlags::INO
            | StatxFlags::SIZE
            | StatxFlags::from_bits_retain(libc::STATX_MNT_ID_UNIQUE),
    )
    .ok()?;
    let same = (opened.stx_dev_major, opened.stx_dev_minor, opened.stx_ino)
        == (looked.stx_dev_major, looked.stx_dev_minor, looked.stx_ino);
    if !same || !regular(opened.stx_mode) {
        return None;
    }
    Some(PlainOpened {
        file: std::fs::File::from(file),
        size: opened.stx_size,
        mount: (opened.stx_mask & libc::STATX_MNT_ID_UNIQUE != 0).then_some(opened.stx_mnt_id),
    })
}

/// The largest file read whole ([`read_text`], the read before an edit) and the largest
/// text an edit writes: the bound on what one such call holds in memory.
pub const WHOLE_FILE_MAX_BYTES: u64 = 16 * 1024 * 1024;

fn too_large(path: &Path, what: &str) -> Error {
    Error::new(
        codes::FS_TOO_LARGE,
        format!(
            "`{}`: {what} is larger than {} MiB, the most handled whole",
            path.display(),
            WHOLE_FILE_MAX_BYTES / (1024 * 1024)
        ),
    )
    .with_help("read it a page at a time with `read` (offset/limit), or change it with a shell command such as `sed -i`")
}

/// The whole of `file` as text, refused beyond [`WHOLE_FILE_MAX_BYTES`] (whatever size it
/// reports: `/proc` files report 0).
fn read_all(file: std::fs::File, path: &Path) -> Result<String> {
    let mut bytes = Vec::new();
    file.take(WHOLE_FILE_MAX_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(e, "read", path))?;
    if bytes.len() as u64 > WHOLE_FILE_MAX_BYTES {
        return Err(too_large(path, "the file"));
    }
    utf8(bytes, path)
}

/// The whole regular file at `path` as UTF-8 text, unless `deny` refuses it.
pub fn read_text(path: &Path, deny: &ReadDeny) -> Result<String> {
    check_path(path)?;
    let (file, _) = open_regular(path, "read", deny)?;
    read_all(file, path)
}

/// A page of lines of the regular file at `args.path` (see [`ReadLines`]). It streams
/// through the file: whatever the file's size, it holds the page, one line of at most
/// `max_line_bytes`, the first [`SNIFF_BYTES`] and a read buffer, and lines skipped to
/// reach `offset` are counted, never kept. A NUL byte or invalid UTF-8 in the first
/// [`SNIFF_BYTES`] or in a line of the page makes it binary: `FS_NOT_TEXT`.
pub fn read_lines(args: &ReadLines, deny: &ReadDeny) -> Result<Lines> {
    check_path(&args.path)?;
    let caps = args.caps;
    if args.offset == 0 || args.limit == Some(0) {
        return Err(Error::invalid("`offset` and `limit` count from 1")
            .with_help("pass offset 1 for the first line"));
    }
    if caps.max_lines == 0 || caps.max_bytes == 0 || caps.max_line_bytes == 0 {
        return Err(
            Error::invalid(format!("every read cap must be at least 1, got {caps:?}"))
                .with_help("raise the caps that are 0"),
        );
    }
    let (file, size) = open_regular(&args.path, "read", deny)?;
    page(file, size, args)
}

/// A page of `args` from `input`, the content of `args.path`, whose reported size is `size`.
fn page(mut input: impl Read, size: u64, args: &ReadLines) -> Result<Lines> {
    let path = &args.path;
    let io = |e: io::Error| io_error(e, "read", path);
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    // A file that reports a size below the sniff's is asked first for one byte more: an
    // answer of exactly its size is a short read, its end, and no read is made only to
    // meet it. Any other answer (more: it grew; less; a size of 0, as many `/proc` files
    // report) is read on to its end or the sniff's bound.
    let mut ended = false;
    if (1..SNIFF_BYTES as u64).contains(&size) {
        head.resize(size as usize + 1, 0);
        let n = loop {
            match input.read(&mut head) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                read => break read.map_err(io)?,
            }
        };
        head.truncate(n);
        ended = n as u64 == size;
    }
    if !ended {
        (&mut input)
            .take((SNIFF_BYTES - head.len()) as u64)
            .read_to_end(&mut head)
            .map_err(io)?;
    }
    if let Err((at, evidence)) = line_text(&head, head.len() == SNIFF_BYTES) {
        return Err(binary(path, size, evidence, at as u64));
    }
    // A sniff shorter than asked for met the end: nothing is read again (every fill of an
    // empty buffer would ask the file once more).
    let rest = if head.len() < SNIFF_BYTES {
        0
    } else {
        u64::MAX
    };
    let input = input.take(rest);
    // Big enough for the whole of a small file (one read and the one that sees its end),
    // at most 64 KiB for a large one.
    let capacity = usize::try_from(size.saturating_add(1))
        .unwrap_or(usize::MAX)
        .clamp(SNIFF_BYTES, 64 * 1024);
    let mut reader = BufReader::with_capacity(capacity, io::Cursor::new(head).chain(input));
    let caps = args.caps;
    let line_cap = usize::try_from(caps.max_line_bytes.min(caps.max_bytes)).unwrap_or(usize::MAX);
    let want = args.limit.map_or(caps.max_lines, |l| l.min(caps.max_lines));
    let mut lines = Lines {
        text: String::new(),
        count: 0,
        size,
        cut: None,
        total: None,
        long_lines: Vec::new(),
    };
    // Lines and bytes consumed so far.
    let (mut number, mut pos) = (0u64, 0u64);
    while number + 1 < args.offset {
        if at_end(&mut reader).map_err(io)? {
            lines.total = Some(number);
            return Ok(lines);
        }
        let (len, broke) = skip_rest(&mut reader).map_err(io)?;
        number += 1;
        pos += len + u64::from(broke);
    }
    let mut line = Vec::new();
    loop {
        if lines.count == want {
            if at_end(&mut reader).map_err(io)? {
                lines.total = Some(number);
            } else if args.limit.is_none_or(|l| l > caps.max_lines) {
                lines.cut = Some(Cut::MaxLines);
            }
            break;
        }
        let Some(end) = line_start(&mut reader, &mut line, line_cap).map_err(io)? else {
            lines.total = Some(number);
            break;
        };
        number += 1;
        let shown = match line_text(&line, end == LineEnd::Beyond) {
            Ok(shown) => shown,
            Err((at, evidence)) if lines.count == 0 => {
                return Err(binary(path, size, evidence, pos + at as u64))
            }
            Err((at, evidence)) => {
                lines.cut = Some(Cut::Binary {
                    what: evidence.to_string(),
                    at: pos + at as u64,
                });
                break;
            }
        };
        // The most this line adds: a cut line's marker and break are not known yet.
        let added = match end {
            LineEnd::Break => shown.len() + 1,
            LineEnd::End => shown.len(),
            LineEnd::Beyond => shown.len() + line_cut_marker(u64::MAX).len() + 1,
        };
        if lines.count > 0 && (lines.text.len() + added) as u64 > caps.max_bytes {
            lines.cut = Some(Cut::MaxBytes);
            break;
        }
        let (len, broke) = match end {
            LineEnd::Break => (line.len() as u64, true),
            LineEnd::End => (line.len() as u64, false),
            LineEnd::Beyond => {
                let (rest, broke) = skip_rest(&mut reader).map_err(io)?;
                (line.len() as u64 + rest, broke)
            }
        };
        pos += len + u64::from(broke);
        lines.text.push_str(shown);
        if end == LineEnd::Beyond {
            lines.text.push_str(&line_cut_marker(len));
            lines.long_lines.push(number);
        }
        if broke {
            lines.text.push('\n');
        }
        lines.count += 1;
    }
    Ok(lines)
}

/// How the start of a line that [`line_start`] read ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LineEnd {
    /// At its line break (consumed).
    Break,
    /// At the end of the input, without a line break.
    End,
    /// The line goes on past the cap; the rest is still to be read.
    Beyond,
}

/// Fills `reader`'s buffer, retrying an interrupted read.
fn fill(reader: &mut impl BufRead) -> io::Result<&[u8]> {
    while let Err(e) = reader.fill_buf() {
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    // Filled: this returns the buffer without reading (the borrow checker cannot pass the
    // loop's borrow out).
    reader.fill_buf()
}

/// `true` when `reader` has nothing more.
fn at_end(reader: &mut impl BufRead) -> io::Result<bool> {
    Ok(fill(reader)?.is_empty())
}

/// Reads the start of the next line into `line`: at most `cap` bytes, the line break
/// consumed but not kept. `None` at the end of the input.
fn line_start(
    reader: &mut impl BufRead,
    line: &mut Vec<u8>,
    cap: usize,
) -> io::Result<Option<LineEnd>> {
    line.clear();
    if at_end(reader)? {
        return Ok(None);
    }
    loop {
        let buf = fill(reader)?;
        if buf.is_empty() {
            return Ok(Some(LineEnd::End));
        }
        let room = cap - line.len();
        // A break right after `room` bytes still ends the line within the cap.
        if let Some(end) = memchr::memchr(b'\n', &buf[..buf.len().min(room.saturating_add(1))]) {
            line.extend_from_slice(&buf[..end]);
            reader.consume(end + 1);
            return Ok(Some(LineEnd::Break));
        }
        if room == 0 {
            return Ok(Some(LineEnd::Beyond));
        }
        let take = buf.len().min(room);
        line.extend_from_slice(&buf[..take]);
        reader.consume(take);
    }
}

/// Consumes the rest of the current line, its break included, keeping nothing. Returns
/// the bytes before the break and whether a break ended them.
fn skip_rest(reader: &mut impl BufRead) -> io::Result<(u64, bool)> {
    let mut len = 0u64;
    loop {
        let buf = fill(reader)?;
        if buf.is_empty() {
            return Ok((len, false));
        }
        match memchr::memchr(b'\n', buf) {
            Some(end) => {
                reader.consume(end + 1);
                return Ok((len + end as u64, true));
            }
            None => {
                let n = buf.len();
                reader.consume(n);
                len += n as u64;
            }
        }
    }
}

/// `bytes` as text, or where in it binary content starts and what it is. A `partial`
/// run of bytes (the start of something longer) may end inside a character: the
/// character is left out.
fn line_text(bytes: &[u8], partial: bool) -> std::result::Result<&str, (usize, &'static str)> {
    if let Some(at) = memchr::memchr(0, bytes) {
        return Err((at, "a NUL byte"));
    }
    match std::str::from_utf8(bytes) {
        Ok(text) => Ok(text),
        Err(e) if partial && e.error_len().is_none() => {
            Ok(std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default())
        }
        Err(e) => Err((e.valid_up_to(), "invalid UTF-8")),
    }
}

/// The `FS_NOT_TEXT` error of a binary file: `evidence` found at byte `at`.
fn binary(path: &Path, size: u64, evidence: &str, at: u64) -> Error {
    let size = if size > 0 {
        format!("{size} bytes")
    } else {
        "size not reported".to_string()
    };
    Error::new(
        codes::FS_NOT_TEXT,
        format!(
            "`{}` is a binary file ({size}; {evidence} at byte {at}), not text; its content is not shown",
            path.display()
        ),
    )
    .with_help(format!(
        "inspect its bytes with a shell instead, e.g. `xxd '{}' | head -n 32`",
        path.display()
    ))
}

/// The entries of directory `path`, sorted by name (kinds do not follow symlinks), unless
/// `deny` refuses it.
pub fn list_dir(args: &ListDir, deny: &ReadDeny) -> Result<Listing> {
    let path = &args.path;
    check_path(path)?;
    if args.max_entries == 0 {
        return Err(Error::invalid("`max_entries` must be at least 1")
            .with_help("pass the most entries to return"));
    }
    let keep = usize::try_from(args.max_entries).unwrap_or(usize::MAX);
    deny.check_path(path)?;
    // `O_DIRECTORY`: anything else is refused by the lookup, before it is opened (a FIFO
    // would block the call forever, a device's open can have effects).
    let dir = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | READ_FLAGS.bits() as i32)
            .open(path)
            .map_err(|e| deny.open_failed(e, "list", path))?
    };
    deny.check(&dir, path)?;
    // Listed through the descriptor that was checked.
    let opened = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dir));
    let rd = std::fs::read_dir(&opened).map_err(|e| io_error(e, "list", path))?;
    // The `keep` smallest names seen so far: a max-heap whose top is the one to drop
    // (names are unique in a directory, so the kind never decides the order).
    let mut first: std::collections::BinaryHeap<(String, Kind)> =
        std::collections::BinaryHeap::new();
    let mut total = 0u64;
    for entry in rd {
        let entry = entry.map_err(|e| io_error(e, "list", path))?;
        total += 1;
        let name = entry.file_name().to_string_lossy().into_owned();
        if first.len() == keep && first.peek().is_some_and(|(top, _)| name >= *top) {
            continue;
        }
        let kind = entry
            .file_type()
            .map(Kind::of)
            .map_err(|e| io_error(e, "list", &entry.path()))?;
        first.push((name, kind));
        if first.len() > keep {
            first.pop();
        }
    }
    let entries = first
        .into_sorted_vec()
        .into_iter()
        .map(|(name, kind)| DirEntry { name, kind })
        .collect();
    Ok(Listing { entries, total })
}

/// One mutex per canonical path: a read-match-write (or a write) of one file is a critical
/// section, so two concurrent edits of the same file never lose either change. Entries are
/// dropped when nobody holds or waits for them.
#[derive(Default)]
pub struct PathLocks {
    map: Mutex<HashMap<PathBuf, Arc<Mutex<()>>>>,
}

impl PathLocks {
    /// Runs `f` while holding the lock for `path`.
    pub fn with<T>(&self, path: &Path, f: impl FnOnce() -> T) -> T {
        let entry = {
            let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
            map.entry(path.to_path_buf()).or_default().clone()
        };
        let out = {
            let _held = entry.lock().unwrap_or_else(|e| e.into_inner());
            f()
        };
        let mut map = self.map.lock().unwrap_or_else(|e| e.into_inner());
        // The map's reference and ours: nobody else holds or waits for it.
        if Arc::strong_count(&entry) == 2 {
            map.remove(path);
        }
        out
    }
}

/// "Too many levels of symbolic links" (Linux and most Unixes use 40).
const ELOOP: i32 = 40;

/// The file a mutation may touch under `policy`, or why not: the fence of every sandboxed
/// `fs` backend. `read-only` refuses; `danger-full-access` opens ambiently; in
/// `workspace-write` the canonical path must lie in a writable root, and the target is then
/// reached beneath that root ([`Target::beneath`]), so a swap after this check cannot escape.
pub fn fenced_target(
    policy: &dsh_sandbox::SandboxExecutionPolicy,
    path: &Path,
    parents: Parents,
) -> Result<Target> {
    check_path(path)?;
    let mode = policy.mode;
    match mode {
        SandboxMode::ReadOnly => Err(sandbox_denied(
            mode,
            path,
            "read-only mode allows no modification",
        )),
        SandboxMode::DangerFullAccess => Target::ambient(&resolve(path)?, parents),
        SandboxMode::WorkspaceWrite => {
            let canonical = dsh_sandbox::canonical_path(path).map_err(|e| match () {
                _ if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(ELOOP) => sandbox_denied(
                    mode,
                    path,
                    &format!("a symlink on the path is dangling or loops, so where it leads cannot be checked ({e})"),
                ),
                _ => io_error(e, "resolve", path),
            })?;
            let fence = Fence::of(policy)
                .map_err(|moved| sandbox_denied(mode, path, &moved.to_string()))?;
            let root = dsh_fs_api::writable_root(&fence, mode, path, &canonical)?;
            let target = Target::beneath_checked(
                (root, fence.identity(root)),
                &canonical,
                parents,
                mode,
                |made| guard(&fence, mode, path, made),
            )?;
            // What was reached, not what was asked: a directory swapped for a symlink
            // into a protected directory after the check above is caught here.
            let reached = reached(&target.parent, path)?;
            guard(&fence, mode, path, &reached.join(&target.name))?;
            Ok(target)
        }
    }
}

/// Where the open directory `dir` really is (its descriptor's path), for a check of what
/// was reached; `path` is the call's, for the error.
fn reached(dir: &Dir, path: &Path) -> Result<PathBuf> {
    fd_entry::link(dir).map_err(|e| io_error(e, "check the directory of", path))
}

/// Whether a mutation creates missing parent directories (a write does, an edit does not).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Parents {
    /// Create them.
    Create,
    /// They must exist.
    Existing,
}

/// A file to mutate, reached through a handle to its parent directory. Every operation is
/// relative to that handle: the temp file and the rename both happen inside it.
pub struct Target {
    parent: Dir,
    name: OsString,
    path: PathBuf,
    fence: Option<SandboxMode>,
}

fn split(path: &Path) -> Result<(&Path, OsString)> {
    match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => Ok((parent, name.to_os_string())),
        _ => Err(Error::new(
            codes::FS_WRONG_KIND,
            format!("`{}` is a directory, not a file", path.display()),
        )
        .with_help("name a file beneath the directory")),
    }
}

impl Target {
    /// The file at canonical `path`, its parent directory opened ambiently (no
    /// confinement); with [`Parents::Create`] missing parent directories are created first.
    pub fn ambient(path: &Path, parents: Parents) -> Result<Target> {
        let (parent, name) = split(path)?;
        if parents == Parents::Create {
            std::fs::create_dir_all(parent)
                .map_err(|e| io_error(e, "create the directories of", path))?;
        }
        let parent = Dir::open_ambient_dir(parent, ambient_authority())
            .map_err(|e| io_error(e, "open the directory of", path))?;
        Ok(Target {
            parent,
            name,
            path: path.to_path_buf(),
            fence: None,
        })
    }

    /// The file at canonical `path`, which must lie beneath the canonical writable `root`.
    /// The parent directories are created and opened THROUGH a handle to `root`, every
    /// component resolved beneath it (openat2 `RESOLVE_BENEATH` where available): a symlink
    /// swapped in after the containment check cannot lead outside. Such an escape is
    /// reported as `FS_SANDBOX_DENIED` under `mode`.
    pub fn beneath(
        root: &Path,
        path: &Path,
        parents: Parents,
        mode: SandboxMode,
    ) -> Result<Target> {
        Target::beneath_checked((root, None), path, parents, mode, |_| Ok(()))
    }

    /// [`Target::beneath`], asking `check` about every directory before it is created, by
    /// the path it is really created at (what was reached, not what was asked): a
    /// directory on the way swapped for a symlink into a protected one gets nothing made
    /// in it. With an identity, the root opened must be that directory ([`Fence::identity`]):
    /// a root renamed away and replaced after the check is refused, not followed.
    pub fn beneath_checked(
        (root, identity): (&Path, Option<FileId>),
        path: &Path,
        parents: Parents,
        mode: SandboxMode,
        check: impl Fn(&Path) -> Result<()>,
    ) -> Result<Target> {
        let rel = path.strip_prefix(root).map_err(|_| {
            sandbox_denied(
                mode,
                path,
                &format!("it is not beneath `{}`", root.display()),
            )
        })?;
        if rel.as_os_str().is_empty() {
            return Err(Error::new(
                codes::FS_WRONG_KIND,
                format!(
                    "`{}` is the writable root itself, a directory",
                    path.display()
                ),
            )
            .with_help("name a file beneath the directory"));
        }
        let (rel_parent, name) = split(rel)?;
        // The window a racing swap would use: checked, nothing opened yet.
        #[cfg(test)]
        race::at(race::Point::Checked);
        let fenced = |e: io::Error, op: &str| {
            if is_escape(&e) {
                sandbox_denied(
                    mode,
                    path,
                    "a symlink or `..` leads outside the writable root",
                )
            } else {
                io_error(e, op, path)
            }
        };
        let root_dir = Dir::open_ambient_dir(root, ambient_authority())
            .map_err(|e| io_error(e, "open the writable root for", path))?;
        if identity.is_some() {
            let opened = FileId::of_fd(root_dir.as_fd())
                .map_err(|e| io_error(e, "check the writable root for", path))?;
            RootMoved::unless(root, identity, opened)
                .map_err(|moved| sandbox_denied(mode, path, &moved.to_string()))?;
        }
        let parent = if rel_parent.as_os_str().is_empty() {
            root_dir
        } else if parents == Parents::Create {
            // One directory at a time, each opened beneath the last: a missing one is
            // checked where it would really be made, then made.
            let mut dir = root_dir;
            for part in rel_parent.components() {
                let part = part.as_os_str();
                dir = match dir.open_dir(part) {
                    Ok(next) => next,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        check(&reached(&dir, path)?.join(part))?;
                        match dir.create_dir(part) {
                            // Something appeared there meanwhile: opening it decides.
                            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                            r => r.map_err(|e| fenced(e, "create the directories of"))?,
                        }
                        dir.open_dir(part)
                            .map_err(|e| fenced(e, "open the directory of"))?
                    }
                    Err(e) => return Err(fenced(e, "open the directory of")),
                };
            }
            dir
        } else {
            root_dir
                .open_dir(rel_parent)
                .map_err(|e| fenced(e, "open the directory of"))?
        };
        #[cfg(test)]
        race::at(race::Point::Opened);
        Ok(Target {
            parent,
            name,
            path: path.to_path_buf(),
            fence: Some(mode),
        })
    }

    /// The canonical path of the file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: io::Error, op: &str) -> Error {
        match self.fence {
            Some(mode) if is_escape(&e) => sandbox_denied(
                mode,
                &self.path,
                "a symlink leads outside the writable root",
            ),
            _ => io_error(e, op, &self.path),
        }
    }

    /// Atomically and durably replaces (or creates) the file: a temp file in the same
    /// directory is written and fsynced, renamed over the target, and the directory is
    /// fsynced so the rename itself survives a crash. The temp file never outlives a
    /// failure.
    pub fn write(&self, content: &[u8]) -> Result<Written> {
        let existing = match self.parent.symlink_metadata(&self.name) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(self.err(e, "inspect")),
        };
        if existing.as_ref().is_some_and(|m| m.is_dir()) {
            return Err(Error::new(
                codes::FS_WRONG_KIND,
                format!("`{}` is a directory, not a file", self.path.display()),
            )
            .with_help("name a file, not a directory"));
        }
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let tmp = OsString::from(format!(
            ".{}.{}-{}.tmp",
            self.name.to_string_lossy(),
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let mut file = self
            .parent
            .open_with(&tmp, OpenOptions::new().write(true).create_new(true))
            .map_err(|e| self.err(e, "create a temp file next to"))?;
        let written = (|| -> io::Result<()> {
            file.write_all(content)?;
            if let Some(m) = existing.as_ref().filter(|m| m.is_file()) {
                file.set_permissions(m.permissions())?;
            }
            file.sync_all()?;
            drop(file);
            self.parent.rename(&tmp, &self.parent, &self.name)?;
            // The handle may be an `O_PATH` one, which cannot be synced: open the directory
            // itself (beneath the same handle) to sync it.
            self.parent.open(".")?.sync_all()
        })();
        if let Err(e) = written {
            let _ = self.parent.remove_file(&tmp);
            return Err(self.err(e, "write"));
        }
        Ok(Written {
            bytes: content.len() as u64,
            created: existing.is_none(),
        })
    }

    /// The file's text, read through the parent handle; anything but a regular file is
    /// refused without blocking on it.
    pub fn read_text(&self) -> Result<String> {
        // The name itself is never followed: it was resolved and checked as a regular
        // path, so a symbolic link there now was put there since (it could lead to a file
        // the call may not read, whose text the edit would then write back readable).
        let opened = open_regular_at(
            std::os::fd::AsRawFd::as_raw_fd(&self.parent),
            &self.name,
            false,
            &self.path,
            "read",
        );
        let (file, size) = match opened {
            Ok(checked) => checked?,
            Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
                let why = "it became a symbolic link after it was checked (where it leads now is not followed)";
                return Err(match self.fence {
                    Some(mode) => sandbox_denied(mode, &self.path, why),
                    None => Error::new(
                        codes::FS_WRONG_KIND,
                        format!("cannot read `{}`: {why}", self.path.display()),
                    )
                    .with_help(
                        "call again; if it keeps changing, something else is replacing the file",
                    ),
                });
            }
            Err(e) => return Err(self.err(e, "read")),
        };
        // A process's `/proc` entry is never read, in any mode: an edit's "not found"
        // would tell whether a guessed text is in it.
        ReadDeny::default().check(&file, &self.path)?;
        if size > WHOLE_FILE_MAX_BYTES {
            return Err(too_large(&self.path, "the file"));
        }
        read_all(file, &self.path)
    }

    /// Replaces `old` with `new` (exactly one occurrence unless `replace_all`) and writes
    /// the result atomically. Run it under [`PathLocks::with`] for a critical section.
    pub fn edit(&self, old: &str, new: &str, replace_all: bool) -> Result<Edited> {
        if old.is_empty() {
            return Err(Error::invalid("`old_string` is empty")
                .with_help("pass the exact text to replace; use write_text to create a file"));
        }
        let text = self.read_text()?;
        let count = text.matches(old).count();
        if count == 0 {
            return Err(Error::new(
                codes::FS_EDIT_NO_MATCH,
                format!("`old_string` was not found in `{}`", self.path.display()),
            )
            .with_help("read the file and copy the exact text, including whitespace"));
        }
        if count > 1 && !replace_all {
            return Err(Error::new(
                codes::FS_EDIT_AMBIGUOUS,
                format!(
                    "`old_string` occurs {count} times in `{}`",
                    self.path.display()
                ),
            )
            .with_help("add surrounding context so it matches once, or set replace_all"));
        }
        let replaced = if replace_all { count } else { 1 };
        let grown = (new.len() as u64)
            .checked_sub(old.len() as u64)
            .map_or(0, |d| d.saturating_mul(replaced as u64));
        if (text.len() as u64).saturating_add(grown) > WHOLE_FILE_MAX_BYTES {
            return Err(too_large(&self.path, "the edited text"));
        }
        let updated = if replace_all {
            text.replace(old, new)
        } else {
            text.replacen(old, new, 1)
        };
        self.write(updated.as_bytes())?;
        Ok(Edited {
            replacements: if replace_all { count as u64 } else { 1 },
        })
    }
}

/// Test-only seam: a callback, per thread, at the two ends of the window between a fenced
/// mutation's containment check and the opens beneath its root, so a test can swap a
/// directory for a symlink exactly inside it (or count the swaps that fell inside it); and
/// inside the window between a read's look at a plain path and its open.
#[cfg(test)]
pub(crate) mod race {
    use std::cell::RefCell;

    /// An end of the window.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Point {
        /// The path was checked; nothing is opened yet.
        Checked,
        /// The parent directory is open; the mutation goes through it from here.
        Opened,
        /// A read looked at its plain path (a regular file); nothing is opened yet.
        Looked,
    }

    type Hook = Box<dyn FnMut(Point)>;

    thread_local! {
        static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    pub fn at(point: Point) {
        HOOK.with(|h| {
            if let Some(hook) = h.borrow_mut().as_mut() {
                hook(point);
            }
        });
    }

    /// Runs `f` with `hook` called at both ends of every window on this thread.
    pub fn with<T>(hook: impl FnMut(Point) + 'static, f: impl FnOnce() -> T) -> T {
        HOOK.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
        let out = f();
        HOOK.with(|h| *h.borrow_mut() = None);
        out
    }
}

mod fd_entry;

#[cfg(test)]
mod race_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use dsh_fs_api::ReadCaps;

    fn args(
        offset: u64,
        limit: Option<u64>,
        (lines, bytes, line_bytes): (u64, u64, u64),
    ) -> ReadLines {
        ReadLines {
            policy: None,
            path: PathBuf::from("/f"),
            offset,
            limit,
            caps: ReadCaps {
                max_lines: lines,
                max_bytes: bytes,
                max_line_bytes: line_bytes,
            },
        }
    }

    /// A reader that counts the reads asked of it.
    struct Reads<'a>(&'a [u8], usize);

    impl Read for Reads<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.1 += 1;
            self.0.read(buf)
        }
    }

    /// What a page must be: its text, count, cut, total and cut lines; or an error's code
    /// and a fragment of its message.
    type Page<'a> = std::result::Result<
        (&'a str, u64, Option<Cut>, Option<u64>, &'a [u64]),
        (&'a str, &'a str),
    >;

    /// Pages `input` (reporting its own size) with `offset`, `limit` and `caps` and compares.
    fn check(input: &[u8], offset: u64, limit: Option<u64>, caps: (u64, u64, u64), want: Page<'_>) {
        let got = page(input, input.len() as u64, &args(offset, limit, caps));
        let shown = String::from_utf8_lossy(input);
        match (got, want) {
            (Ok(l), Ok((text, count, cut, total, long))) => {
                let got = (
                    l.text.as_str(),
                    l.count,
                    l.cut,
                    l.total,
                    l.long_lines.as_slice(),
                );
                assert_eq!(
                    got,
                    (text, count, cut, total, long),
                    "{shown:?} offset {offset} limit {limit:?} caps {caps:?}"
                );
                assert_eq!(l.size, input.len() as u64);
            }
            (Err(e), Err((code, fragment))) => {
                assert_eq!(e.code, code, "{shown:?}: {e}");
                assert!(e.message.contains(fragment), "{shown:?}: {e}");
            }
            (got, want) => panic!("{shown:?} offset {offset}: got {got:?}, wanted {want:?}"),
        }
    }

    #[test]
    fn pages_follow_offset_limit_and_caps() {
        const BIG: (u64, u64, u64) = (100, 1000, 100);
        // A file smaller than the sniff that reads exactly its reported size is read once:
        // no read is made only to meet its end. One that grew since, or reports 0 (as
        // `/proc` files do), is read to its end.
        let grown = b"a\nb\nc\n";
        for (size, reads) in [(6, 1), (4, 3), (0, 2)] {
            let mut input = Reads(&grown[..], 0);
            let got = page(&mut input, size, &args(1, None, BIG)).expect("a page");
            assert_eq!((got.text.as_str(), got.total), ("a\nb\nc\n", Some(3)));
            assert_eq!(input.1, reads, "reported size {size}");
        }
        let abc = b"a\nb\nc\n";
        check(abc, 1, None, BIG, Ok(("a\nb\nc\n", 3, None, Some(3), &[])));
        check(
            b"a\nb\nc",
            1,
            None,
            BIG,
            Ok(("a\nb\nc", 3, None, Some(3), &[])),
        );
        check(
            b"a\r\nb\r\n",
            1,
            None,
            BIG,
            Ok(("a\r\nb\r\n", 2, None, Some(2), &[])),
        );
        check(b"", 1, None, BIG, Ok(("", 0, None, Some(0), &[])));
        check(abc, 2, Some(1), BIG, Ok(("b\n", 1, None, None, &[])));
        check(abc, 3, Some(5), BIG, Ok(("c\n", 1, None, Some(3), &[])));
        check(abc, 5, None, BIG, Ok(("", 0, None, Some(3), &[])));
        // The line cap: cut when more follows, not when the file ends there or `limit` stops.
        check(
            abc,
            1,
            None,
            (2, 1000, 100),
            Ok(("a\nb\n", 2, Some(Cut::MaxLines), None, &[])),
        );
        check(
            abc,
            1,
            None,
            (3, 1000, 100),
            Ok(("a\nb\nc\n", 3, None, Some(3), &[])),
        );
        check(
            abc,
            1,
            Some(2),
            (2, 1000, 100),
            Ok(("a\nb\n", 2, None, None, &[])),
        );
        check(
            abc,
            1,
            Some(3),
            (2, 1000, 100),
            Ok(("a\nb\n", 2, Some(Cut::MaxLines), None, &[])),
        );
        // The byte cap: a page ends before a line that does not fit ...
        check(
            b"ab\ncd\nef\n",
            1,
            None,
            (100, 7, 100),
            Ok(("ab\ncd\n", 2, Some(Cut::MaxBytes), None, &[])),
        );
        // ... but always holds its first line, cut to the byte cap.
        check(
            b"abcdef\nx\n",
            1,
            None,
            (100, 2, 100),
            Ok((
                "ab [… line cut: 6 bytes]\n",
                1,
                Some(Cut::MaxBytes),
                None,
                &[1],
            )),
        );
        // Long lines are cut on a character boundary and marked with their length.
        check(
            b"abcdef\nxy\nlast",
            1,
            None,
            (100, 1000, 3),
            Ok((
                "abc [… line cut: 6 bytes]\nxy\nlas [… line cut: 4 bytes]",
                3,
                None,
                Some(3),
                &[1, 3],
            )),
        );
        check(
            "aéé\n".as_bytes(),
            1,
            None,
            (100, 1000, 4),
            Ok(("aé [… line cut: 5 bytes]\n", 1, None, Some(1), &[1])),
        );
        check(
            b"abc\n",
            1,
            None,
            (100, 1000, 3),
            Ok(("abc\n", 1, None, Some(1), &[])),
        );
    }

    #[test]
    fn binary_content_is_refused_or_ends_the_page() {
        const BIG: (u64, u64, u64) = (100, 100_000, 100);
        let not_text = codes::FS_NOT_TEXT;
        check(
            b"ab\0c\n",
            1,
            None,
            BIG,
            Err((not_text, "(5 bytes; a NUL byte at byte 2)")),
        );
        check(
            b"ab\n\xff\n",
            2,
            None,
            BIG,
            Err((not_text, "invalid UTF-8 at byte 3")),
        );
        // The start of the file is judged whatever the offset ...
        check(
            b"\0\nb\n",
            2,
            None,
            BIG,
            Err((not_text, "a NUL byte at byte 0")),
        );
        // ... and a character cut by the end of a short file is invalid.
        check(
            b"ab\xc3",
            1,
            None,
            BIG,
            Err((not_text, "invalid UTF-8 at byte 2")),
        );
        // Past the sniffed start, a binary line ends the page; a page starting there fails.
        let mut late = b"0123456\n".repeat(SNIFF_BYTES / 8 + 1);
        let at = late.len() as u64 + 1;
        late.extend_from_slice(b"x\0\nend\n");
        let lines = SNIFF_BYTES as u64 / 8 + 1;
        let got = page(&late[..], late.len() as u64, &args(lines, None, BIG)).expect("a page");
        assert_eq!(got.text, "0123456\n");
        let cut = Cut::Binary {
            what: "a NUL byte".into(),
            at,
        };
        assert_eq!((got.count, got.cut), (1, Some(cut)));
        check(
            &late,
            lines + 1,
            None,
            BIG,
            Err((not_text, &format!("a NUL byte at byte {at}"))),
        );
        check(
            &late,
            lines + 2,
            None,
            BIG,
            Ok(("end\n", 1, None, Some(lines + 2), &[])),
        );
    }

    /// An endless input of numbered lines: a page of it must end without reading it all.
    struct Endless(u64, Vec<u8>);

    impl Read for Endless {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.1.is_empty() {
                self.0 += 1;
                self.1 = format!("line {}\n", self.0).into_bytes();
            }
            let n = buf.len().min(self.1.len());
            buf[..n].copy_from_slice(&self.1[..n]);
            self.1.drain(..n);
            Ok(n)
        }
    }

    #[test]
    fn a_page_streams_through_an_endless_input() {
        let got = page(
            Endless(0, Vec::new()),
            0,
            &args(200_000, Some(2), (10, 1000, 100)),
        )
        .expect("a page");
        assert_eq!(got.text, "line 200000\nline 200001\n");
        assert_eq!((got.count, got.cut, got.total), (2, None, None));
        let got = page(
            Endless(0, Vec::new()),
            0,
            &args(1, None, (1_000_000, 64, 100)),
        )
        .expect("a page");
        assert_eq!(got.cut, Some(Cut::MaxBytes), "{got:?}");
        assert!(got.text.len() <= 64, "{got:?}");
    }

    /// Runs `f` on another thread; fails when it has not answered within ten seconds (it
    /// blocked), instead of hanging the test.
    fn within_deadline<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(f()));
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the read must answer at once, not block")
    }

    #[test]
    fn non_regular_files_are_refused_without_blocking() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let fifo = root.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
        let paged = |path: PathBuf| {
            within_deadline(move || {
                read_lines(
                    &ReadLines {
                        path,
                        ..args(1, None, (10, 10, 10))
                    },
                    &ReadDeny::default(),
                )
                .map(|l| l.text)
            })
        };
        let whole = |path: PathBuf| within_deadline(move || read_text(&path, &ReadDeny::default()));
        let edited = |path: PathBuf| {
            within_deadline(move || {
                let target = Target::ambient(&path, Parents::Existing)?;
                target.edit("a", "b", false)
            })
        };
        let fenced = |path: PathBuf, root: PathBuf| {
            within_deadline(move || {
                let target =
                    Target::beneath(&root, &path, Parents::Existing, SandboxMode::WorkspaceWrite)?;
                target.read_text()
            })
        };
        let wrong_kind = |e: Error, kind: &str| {
            assert_eq!(e.code, codes::FS_WRONG_KIND, "{e}");
            assert!(
                e.message
                    .contains(&format!("it is {kind}, not a regular file")),
                "{e}"
            );
        };
        let fifo_kind = "a FIFO (named pipe)";
        wrong_kind(paged(fifo.clone()).unwrap_err(), fifo_kind);
        wrong_kind(whole(fifo.clone()).unwrap_err(), fifo_kind);
        wrong_kind(edited(fifo.clone()).unwrap_err(), fifo_kind);
        wrong_kind(fenced(fifo.clone(), root.clone()).unwrap_err(), fifo_kind);
        wrong_kind(paged("/dev/null".into()).unwrap_err(), "a character device");
        wrong_kind(paged(root.clone()).unwrap_err(), "a directory");
        let socket = root.join("socket");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
        wrong_kind(paged(socket.clone()).unwrap_err(), "a socket");
        wrong_kind(fenced(socket, root.clone()).unwrap_err(), "a socket");
        // A /proc file reports size 0 and reads all the same.
        assert_eq!(paged("/proc/sys/kernel/ostype".into()).unwrap(), "Linux\n");
    }

    /// A mount found not to be a `proc` file system is remembered by its unique id, and a
    /// file on it is judged without asking again; a `proc` mount is never remembered,
    /// however often a file on it is judged.
    #[test]
    fn only_mounts_that_are_not_proc_are_remembered() {
        use rustix::fs::{AtFlags, StatxFlags};
        use std::os::fd::AsFd;
        use std::sync::atomic::Ordering::Relaxed;
        let unique = |f: &std::fs::File| {
            let mask = StatxFlags::from_bits_retain(libc::STATX_MNT_ID_UNIQUE);
            let s = rustix::fs::statx(f, "", AtFlags::EMPTY_PATH, mask).expect("statx");
            assert!(
                s.stx_mask & libc::STATX_MNT_ID_UNIQUE != 0,
                "this test needs unique mount ids (`STATX_MNT_ID_UNIQUE`, Linux 6.8), which \
                 this kernel does not give: it cannot run here"
            );
            s.stx_mnt_id
        };
        let remembered = |id: u64| NOT_PROC.iter().any(|m| m.load(Relaxed) == id);
        let proc = std::fs::File::open("/proc/version").expect("/proc/version");
        let tmp = tempfile::NamedTempFile::new().expect("a file");
        let file = tmp.reopen().expect("reopen");
        let (proc_id, file_id) = (unique(&proc), unique(&file));
        for _ in 0..2 {
            assert!(on_procfs(proc.as_fd(), Some(proc_id)));
        }
        assert!(!remembered(proc_id));
        assert!(!on_procfs(file.as_fd(), Some(file_id)));
        assert!(remembered(file_id));
        assert!(on_procfs(proc.as_fd(), Some(proc_id)));
        assert!(
            on_procfs(proc.as_fd(), None),
            "without an id the kernel is asked"
        );
        // Taken at its word: a descriptor said to be on the remembered mount is not asked.
        assert!(!on_procfs(proc.as_fd(), Some(file_id)));
    }

    #[test]
    fn path_checks_name_the_problem() {
        let check = |p: &str, needle: &str| {
            let err = check_path(Path::new(p)).unwrap_err();
            assert_eq!(err.code, cordis_sdk::codes::INVALID_ARGUMENT, "{p:?}");
            assert!(err.message.contains(needle), "{p:?}: {}", err.message);
        };
        check("", "empty");
        check("/a\0b", "NUL");
        check("rel/x", "relative");
        assert!(check_path(Path::new("/abs")).is_ok());
    }

    #[test]
    fn write_edit_round_trip_and_kinds() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let file = root.join("a/b/c.txt");
        let t =
            Target::beneath(&root, &file, Parents::Create, SandboxMode::WorkspaceWrite).unwrap();
        assert!(t.write(b"one two two").unwrap().created);
        assert!(!t.write(b"one two two").unwrap().created);
        assert_eq!(
            t.edit("two", "2", false).unwrap_err().code,
            codes::FS_EDIT_AMBIGUOUS
        );
        assert_eq!(
            t.edit("zzz", "2", false).unwrap_err().code,
            codes::FS_EDIT_NO_MATCH
        );
        assert_eq!(t.edit("two", "2", true).unwrap().replacements, 2);
        assert_eq!(read_text(&file, &ReadDeny::default()).unwrap(), "one 2 2");
        let names: Vec<String> = list_dir(
            &ListDir {
                path: root.join("a/b"),
                max_entries: 10,
                policy: None,
            },
            &ReadDeny::default(),
        )
        .unwrap()
        .entries
        .into_iter()
        .map(|e| e.name)
        .collect();
        assert_eq!(names, ["c.txt"], "no temp file is left behind");
        let err = Target::beneath(&root, &root, Parents::Create, SandboxMode::WorkspaceWrite)
            .err()
            .unwrap();
        assert_eq!(err.code, codes::FS_WRONG_KIND);
        std::fs::write(root.join("bin"), [0xff, 0xfe]).unwrap();
        assert_eq!(
            read_text(&root.join("bin"), &ReadDeny::default())
                .unwrap_err()
                .code,
            codes::FS_NOT_TEXT
        );
        assert_eq!(
            read_text(&root.join("none"), &ReadDeny::default())
                .unwrap_err()
                .code,
            codes::FS_NOT_FOUND
        );
    }

    #[test]
    fn whole_file_operations_stop_exactly_at_their_bound() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let max = WHOLE_FILE_MAX_BYTES as usize;
        let at = root.join("at.txt");
        let over = root.join("over.txt");
        std::fs::write(&at, "a".repeat(max)).unwrap();
        std::fs::write(&over, "a".repeat(max + 1)).unwrap();
        let code = |r: Result<String>| r.map(|t| t.len()).map_err(|e| e.code);
        assert_eq!(code(read_text(&at, &ReadDeny::default())), Ok(max));
        assert_eq!(
            code(read_text(&over, &ReadDeny::default())),
            Err(codes::FS_TOO_LARGE.to_string())
        );
        let target = |p: &Path| {
            Target::beneath(&root, p, Parents::Existing, SandboxMode::WorkspaceWrite).unwrap()
        };
        assert_eq!(code(target(&at).read_text()), Ok(max));
        assert_eq!(
            code(target(&over).read_text()),
            Err(codes::FS_TOO_LARGE.to_string())
        );
        // An edit may grow the text up to the bound, not past it.
        std::fs::write(&at, format!("{}x", "a".repeat(max - 2))).unwrap();
        assert_eq!(target(&at).edit("x", "yy", false).unwrap().replacements, 1);
        assert_eq!(std::fs::metadata(&at).unwrap().len(), max as u64);
        let err = target(&at).edit("yy", "zzz", false).unwrap_err();
        assert_eq!(err.code, codes::FS_TOO_LARGE);
        assert_eq!(
            std::fs::metadata(&at).unwrap().len(),
            max as u64,
            "unchanged"
        );
        // One occurrence needs no `replace_all`.
        std::fs::write(&at, "one two").unwrap();
        assert_eq!(target(&at).edit("two", "2", false).unwrap().replacements, 1);
    }

    #[test]
    fn listings_keep_the_first_names_and_count_them_all() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().canonicalize().unwrap();
        // Created in reverse, so the directory's order is not the answer.
        for name in ["e", "d", "c", "b", "a"] {
            std::fs::write(dir.join(name), "").unwrap();
        }
        std::fs::create_dir(dir.join("f")).unwrap();
        let list = |max| {
            let l = list_dir(
                &ListDir {
                    path: dir.clone(),
                    max_entries: max,
                    policy: None,
                },
                &ReadDeny::default(),
            )
            .unwrap();
            let names: Vec<String> = l.entries.into_iter().map(|e| e.name).collect();
            (names.join(""), l.total)
        };
        assert_eq!(list(1), ("a".to_string(), 6));
        assert_eq!(list(2), ("ab".to_string(), 6));
        assert_eq!(list(5), ("abcde".to_string(), 6));
        assert_eq!(list(6), ("abcdef".to_string(), 6));
        assert_eq!(list(100), ("abcdef".to_string(), 6));
        let kinds = list_dir(
            &ListDir {
                path: dir.clone(),
                max_entries: 100,
                policy: None,
            },
            &ReadDeny::default(),
        )
        .unwrap();
        assert_eq!(kinds.entries[5].kind, Kind::Dir);
        assert_eq!(kinds.entries[0].kind, Kind::File);
        assert!(list_dir(
            &ListDir {
                path: dir,
                max_entries: 0,
                policy: None,
            },
            &ReadDeny::default()
        )
        .is_err());
    }

    #[test]
    fn path_locks_forget_paths_nobody_holds() {
        let locks = PathLocks::default();
        let held = |locks: &PathLocks| locks.map.lock().unwrap().len();
        assert_eq!(locks.with(Path::new("/a"), || held(&locks)), 1);
        assert_eq!(held(&locks), 0, "released, the entry is gone");
        // Two paths held at once are two entries, both gone once released.
        locks.with(Path::new("/b"), || {
            std::thread::scope(|s| {
                let waiter = s.spawn(|| locks.with(Path::new("/c"), || held(&locks)));
                assert_eq!(waiter.join().unwrap(), 2);
            });
        });
        assert_eq!(held(&locks), 0);
    }

    #[test]
    fn only_a_resolution_leaving_the_handle_is_an_escape() {
        assert!(is_escape(&io::Error::new(
            io::ErrorKind::PermissionDenied,
            "outside"
        )));
        assert!(!is_escape(&io::Error::from_raw_os_error(libc::EACCES)));
        assert!(!is_escape(&io::Error::from(io::ErrorKind::NotFound)));
        let help = |mode| {
            sandbox_denied(mode, Path::new("/x"), "why")
                .help
                .unwrap_or_default()
        };
        assert!(help(SandboxMode::ReadOnly).starts_with("read-only mode allows no modification"));
        assert!(help(SandboxMode::WorkspaceWrite).starts_with("modify files beneath the workspace"));
    }

    #[test]
    fn errors_beneath_the_root_keep_their_own_codes() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let ww = SandboxMode::WorkspaceWrite;
        // Not an escape: a missing file to edit, a name too long to inspect.
        let missing = Target::beneath(&root, &root.join("missing.txt"), Parents::Existing, ww)
            .unwrap()
            .edit("a", "b", false)
            .unwrap_err();
        assert_eq!(missing.code, codes::FS_NOT_FOUND, "{missing}");
        let long = root.join("n".repeat(300));
        let err = Target::beneath(&root, &long, Parents::Create, ww)
            .unwrap()
            .write(b"x")
            .unwrap_err();
        assert!(err.message.contains("cannot inspect"), "{err}");
        // What is not a regular file is named, with help that fits it.
        std::fs::create_dir(root.join("dir")).unwrap();
        let dir = read_text(&root.join("dir"), &ReadDeny::default()).unwrap_err();
        let help = |e: &Error| e.help.clone().unwrap_or_default();
        assert!(
            help(&dir).starts_with("list the directory instead"),
            "{dir}"
        );
        let fifo = root.join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR | rustix::fs::Mode::WUSR,
            0,
        )
        .unwrap();
        let pipe = read_text(&fifo, &ReadDeny::default()).unwrap_err();
        assert!(help(&pipe).contains("timeout 5 head"), "{pipe}");
    }

    /// An edit reads the file before it writes: a process's `/proc` entry is refused
    /// there, in any mode, before its text is searched (the search's "not found" would tell
    /// whether a guessed text is in it), and the file is left as it was.
    #[test]
    fn an_edit_never_searches_a_process_entry() {
        for path in ["/proc/self/environ", "/proc/thread-self/comm"] {
            let target =
                Target::ambient(&resolve(Path::new(path)).unwrap(), Parents::Existing).unwrap();
            let err = target.edit("PATH=", "x", false).unwrap_err();
            assert_eq!(err.code, codes::FS_READ_DENIED, "{path}: {err}");
            assert!(err.message.contains("entry of a process"), "{path}: {err}");
        }
    }

    /// A read's path is resolved only when its open fails: an alias of a process's `/proc`
    /// entry is then refused as such (an unprivileged host's reopen of another process's
    /// entry fails with EACCES), any other failure keeps its own code, and a read through
    /// the alias that opens is refused on what was opened.
    #[test]
    fn a_process_entry_behind_an_alias_is_refused_whether_or_not_it_opens() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().canonicalize().unwrap();
        let alias = root.join("env");
        std::os::unix::fs::symlink("/proc/self/environ", &alias).unwrap();
        let deny = ReadDeny::default();
        let refused = deny.open_failed(io::Error::from_raw_os_error(libc::EACCES), "read", &alias);
        assert_eq!(refused.code, codes::FS_READ_DENIED, "{refused}");
        assert!(refused.message.contains("entry of a process"), "{refused}");
        let missing = root.join("missing.txt");
        let other = deny.open_failed(io::Error::from_raw_os_error(libc::ENOENT), "read", &missing);
        assert_eq!(other.code, codes::FS_NOT_FOUND, "{other}");
        let read = read_lines(
            &ReadLines {
                path: alias.clone(),
                ..args(1, None, (10, 10, 10))
            },
            &deny,
        )
        .unwrap_err();
        assert_eq!(read.code, codes::FS_READ_DENIED, "{read}");
        let whole = read_text(&alias, &deny).unwrap_err();
        assert_eq!(whole.code, codes::FS_READ_DENIED, "{whole}");
    }
}
