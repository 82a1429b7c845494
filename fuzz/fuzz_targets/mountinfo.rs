//! Fuzz target `mountinfo`: any bytes as the text of a `mountinfo` file
//! (`dsh_sandbox::mountinfo::mounts`) must parse without a panic; and a line whose mount
//! point is the input's first line, escaped the way the kernel escapes it, must give that
//! mount point back exactly.

#![no_main]

use std::os::unix::ffi::OsStrExt;

use dsh_sandbox::mountinfo::mounts;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for mount in mounts(data) {
        let _ = (mount.root.as_os_str().len(), mount.point.as_os_str().len());
    }
    let point = data.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut escaped = Vec::with_capacity(point.len() * 4);
    for &b in point {
        match b {
            b' ' | b'\t' | b'\n' | b'\\' => escaped.extend(format!("\\{b:03o}").bytes()),
            _ => escaped.push(b),
        }
    }
    let mut line = b"7 1 0:21 / ".to_vec();
    line.extend(&escaped);
    line.extend(b" rw,nosuid - proc proc rw\n");
    let parsed: Vec<_> = mounts(&line).collect();
    assert_eq!(parsed.len(), 1, "{line:?}");
    assert_eq!(parsed[0].point.as_os_str().as_bytes(), point, "{line:?}");
    assert_eq!(parsed[0].fstype, "proc");
});
