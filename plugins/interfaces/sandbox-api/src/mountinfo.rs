//! The mounts a `mountinfo` file lists (`/proc/self/mountinfo`, see proc(5)): one line
//! each, `ID PARENT MAJOR:MINOR ROOT POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE
//! SUPEROPTIONS`, each path with space, tab, newline and backslash escaped in octal.
//!
//! What a confinement needs to know of a mount: where it is (its mount point), what of its
//! file system it shows (its root), and its kind (`proc`, `cgroup2`, ...).
//!
//! ```
//! let table = b"22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
//!               67 46 0:21 /31804 /srv/my\\040procs rw - proc proc rw\n";
//! let mounts: Vec<_> = dsh_sandbox::mountinfo::mounts(table).collect();
//! assert_eq!(mounts[1].id, 67);
//! assert_eq!(mounts[1].root, std::path::Path::new("/31804"));
//! assert_eq!(mounts[1].point, std::path::Path::new("/srv/my procs"));
//! assert_eq!(mounts[1].fstype, "proc");
//! ```

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::path::PathBuf;

/// One mount of a `mountinfo` file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount<'a> {
    /// The mount's id (what `statx` reports as `STATX_MNT_ID`).
    pub id: u64,
    /// The directory of its file system the mount shows at its mount point (`/` for the
    /// whole; a bind mount of a directory shows that directory).
    pub root: PathBuf,
    /// Where it is mounted, as this process sees the tree.
    pub point: PathBuf,
    /// The file system's type (`proc`, `cgroup2`, `ext4`, ...).
    pub fstype: &'a str,
    /// The file system's own options (empty when not UTF-8).
    pub super_options: &'a str,
}

/// The mounts `table` (the text of a `mountinfo` file) lists, in its order; a line that
/// does not have a mount's fields is passed over.
pub fn mounts(table: &[u8]) -> impl Iterator<Item = Mount<'_>> {
    table.split(|&b| b == b'\n').filter_map(mount)
}

fn mount(line: &[u8]) -> Option<Mount<'_>> {
    let mut fields = line.split(|&b| b == b' ');
    let id = std::str::from_utf8(fields.next()?).ok()?.parse().ok()?;
    let mut fields = fields.skip(2);
    let (root, point) = (unescape(fields.next()?)?, unescape(fields.next()?)?);
    // The mount's options, then optional fields up to the lone `-` before the type.
    let mut after = fields.skip(1).skip_while(|f| *f != b"-").skip(1);
    let fstype = std::str::from_utf8(after.next()?).ok()?;
    let super_options = after
        .nth(1)
        .and_then(|o| std::str::from_utf8(o).ok())
        .unwrap_or("");
    Some(Mount {
        id,
        root,
        point,
        fstype,
        super_options,
    })
}

/// A `mountinfo` path with its octal escapes (`\040` for a space) decoded; a backslash not
/// followed by three octal digits is itself. `None` for an escape beyond a byte.
fn unescape(field: &[u8]) -> Option<PathBuf> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                let value = d.iter().fold(0u32, |n, b| n * 8 + u32::from(b - b'0'));
                out.push(u8::try_from(value).ok()?);
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    Some(PathBuf::from(OsString::from_vec(out)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Escapes are decoded (`\040` a space, `\134` a backslash); a backslash not followed
    /// by three octal digits is itself; an escape beyond a byte, or a line without a
    /// mount's fields, is no mount; optional fields are passed over up to the lone `-`
    /// (a path that is `-` is not taken for it).
    #[test]
    fn mounts_are_read_with_their_paths_unescaped() {
        let table = b"22 1 0:21 / /proc rw,nosuid - proc proc rw\n\
                      67 46 0:21 /31804 /srv/my\\040procs\\134x rw - proc proc rw\n\
                      68 46 0:21 /a\\9b /odd rw shared:1 - cgroup2 cgroup2 rw,nsdelegate\n\
                      69 46 0:21 / /big\\777 rw - proc proc rw\n\
                      garbage\n\
                      70 46 0:21 / /plain\\ rw - tmpfs tmpfs\n\
                      71 46 0:21 - - rw shared:3 master:2 - ext4 /dev/x rw\n";
        let found: Vec<(u64, String, String, &str, &str)> = mounts(table)
            .map(|m| {
                let (root, point) = (m.root.display().to_string(), m.point.display().to_string());
                (m.id, root, point, m.fstype, m.super_options)
            })
            .collect();
        assert_eq!(
            found,
            vec![
                (22, "/".into(), "/proc".into(), "proc", "rw"),
                (67, "/31804".into(), "/srv/my procs\\x".into(), "proc", "rw"),
                (
                    68,
                    "/a\\9b".into(),
                    "/odd".into(),
                    "cgroup2",
                    "rw,nsdelegate"
                ),
                (70, "/".into(), "/plain\\".into(), "tmpfs", ""),
                (71, "-".into(), "-".into(), "ext4", "rw"),
            ]
        );
    }
}
