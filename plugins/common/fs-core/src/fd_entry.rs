//! A descriptor this process holds, reached again by its `/proc/self/fd` entry: reopened
//! for reading (a file first opened with `O_PATH`, so that nothing but a regular file is
//! ever opened for real) or read as a link (what it names now).
//!
//! The `fd` directory is opened once per process and each entry is looked up beneath it,
//! one name instead of three (`/proc`, the `self` magic link and `fd`, each revalidated on
//! every walk). A forked child, whose descriptor table the held directory does not show,
//! and a process where it could not be opened walk the whole path.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::OnceLock;

/// `/proc/self/fd` as the process that opened it.
struct FdDir {
    pid: rustix::process::Pid,
    dir: OwnedFd,
}

/// The held `fd` directory, when this process opened it.
fn fd_dir() -> Option<BorrowedFd<'static>> {
    static DIR: OnceLock<Option<FdDir>> = OnceLock::new();
    let held = DIR
        .get_or_init(|| {
            use rustix::fs::{Mode, OFlags};
            let dir = rustix::fs::open(
                "/proc/self/fd",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ok()?;
            Some(FdDir {
                pid: rustix::process::getpid(),
                dir,
            })
        })
        .as_ref()?;
    (held.pid == rustix::process::getpid()).then(|| held.dir.as_fd())
}

/// `fd`'s entry: beneath the held directory, or the whole path.
fn entry(fd: BorrowedFd<'_>) -> (Option<BorrowedFd<'static>>, String) {
    match fd_dir() {
        Some(dir) => (Some(dir), fd.as_raw_fd().to_string()),
        None => (None, format!("/proc/self/fd/{}", fd.as_raw_fd())),
    }
}

/// `fd` opened again, read-only with `flags` (close-on-exec).
pub(crate) fn reopen(fd: impl AsFd, flags: rustix::fs::OFlags) -> io::Result<std::fs::File> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::RDONLY | OFlags::CLOEXEC | flags;
    let opened = match entry(fd.as_fd()) {
        (Some(dir), name) => rustix::fs::openat(dir, name.as_str(), flags, Mode::empty()),
        (None, path) => rustix::fs::open(path.as_str(), flags, Mode::empty()),
    };
    Ok(std::fs::File::from(opened?))
}

/// What `fd` names now.
pub(crate) fn link(fd: impl AsFd) -> io::Result<PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    let target = match entry(fd.as_fd()) {
        (Some(dir), name) => rustix::fs::readlinkat(dir, name.as_str(), Vec::new()),
        (None, path) => rustix::fs::readlinkat(rustix::fs::CWD, path.as_str(), Vec::new()),
    }?;
    Ok(PathBuf::from(std::ffi::OsString::from_vec(
        target.into_bytes(),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_reopens_and_names_the_descriptor_in_this_process_and_in_a_forked_child() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().canonicalize().unwrap().join("f.txt");
        std::fs::write(&path, "contents").unwrap();
        let check = || -> Result<(), String> {
            let handle = rustix::fs::open(
                &path,
                rustix::fs::OFlags::PATH | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| e.to_string())?;
            if link(&handle).map_err(|e| e.to_string())? != path {
                return Err("the link does not name the file".into());
            }
            let mut text = String::new();
            io::Read::read_to_string(
                &mut reopen(&handle, rustix::fs::OFlags::empty()).map_err(|e| e.to_string())?,
                &mut text,
            )
            .map_err(|e| e.to_string())?;
            if text != "contents" {
                return Err(format!("reopened, it reads {text:?}"));
            }
            Ok(())
        };
        // The parent holds the directory before the fork: the child must not use it.
        check().unwrap();
        assert!(fd_dir().is_some(), "`/proc/self/fd` was not held");
        // SAFETY: the child runs only `check` (opens, reads, no locks held across the
        // fork in this single test's thread) and leaves by `_exit`.
        match unsafe { libc::fork() } {
            0 => {
                // A descriptor the parent does not have at this number: open a few first.
                let _spare: Vec<_> = (0..4).map(|_| std::fs::File::open("/").unwrap()).collect();
                let code = match (fd_dir().is_none(), check()) {
                    (true, Ok(())) => 0,
                    _ => 1,
                };
                // SAFETY: leaving the child without running the parent's destructors.
                unsafe { libc::_exit(code) }
            }
            -1 => panic!("fork: {}", io::Error::last_os_error()),
            child => {
                let mut status = 0;
                // SAFETY: waiting for our own child.
                assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
                assert!(
                    libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
                    "in the forked child the entry led elsewhere (status {status})"
                );
            }
        }
    }
}
