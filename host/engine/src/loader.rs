//! Finding and loading plugin libraries through abi_stable's raw-library path
//! (`RawLibrary` + `lib_header_from_raw_library` + `init_root_module`), never the per-type
//! cached `load_from*` functions, which hand back the first plugin for every later library.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use abi_stable::library::{lib_header_from_raw_library, LibraryError, RawLibrary, RootModule};
use abi_stable::sabi_types::VersionNumber;
use abi_stable::std_types::{RResult, RStr};
use cordis_sdk::abi::{PluginModRef, RError};

/// Where plugin libraries are looked for, in order.
#[derive(Clone, Debug, Default)]
pub struct SearchPath {
    /// Directories with the reason each is on the path.
    pub dirs: Vec<(PathBuf, &'static str)>,
}

/// The environment variable that adds plugin directories (`:`-separated).
pub(crate) const PLUGIN_PATH_ENV: &str = "CORDIS_PLUGIN_PATH";

impl SearchPath {
    /// `--plugin-path` flags, then `CORDIS_PLUGIN_PATH`, then the standard directories
    /// ([`standard_plugin_dirs`]).
    pub fn new(flags: &[PathBuf]) -> Self {
        Self::for_binary(flags, std::env::current_exe().ok().as_deref())
    }

    /// The search path of the `cordis` binary at `exe` (its standard directories depend on
    /// where it is), with `flags` and `CORDIS_PLUGIN_PATH` first: what that binary would
    /// search, asked from another process (a plugin's tests).
    pub fn for_binary(flags: &[PathBuf], exe: Option<&Path>) -> Self {
        let mut dirs: Vec<(PathBuf, &'static str)> =
            flags.iter().map(|d| (d.clone(), "--plugin-path")).collect();
        if let Some(env) = std::env::var_os(PLUGIN_PATH_ENV) {
            dirs.extend(
                std::env::split_paths(&env)
                    .filter(|p| !p.as_os_str().is_empty())
                    .map(|p| (p, PLUGIN_PATH_ENV)),
            );
        }
        dirs.extend(standard_plugin_dirs(|name| std::env::var_os(name), exe));
        SearchPath { dirs }
    }

    /// The first library file for `plugin`, or every path that was tried.
    pub fn find(&self, plugin: &str) -> Result<PathBuf, Vec<PathBuf>> {
        let file = library_file_name(plugin);
        let tried: Vec<PathBuf> = self.dirs.iter().map(|(d, _)| d.join(&file)).collect();
        tried.iter().find(|p| p.is_file()).cloned().ok_or(tried)
    }

    /// Every library file for `plugin` on the path, in search order: the first is the one
    /// loaded, the others are shadowed by it.
    pub fn find_all(&self, plugin: &str) -> Vec<PathBuf> {
        let file = library_file_name(plugin);
        self.dirs
            .iter()
            .map(|(d, _)| d.join(&file))
            .filter(|p| p.is_file())
            .collect()
    }

    /// Every plugin library in the search path (for "which plugin provides X?" help).
    pub(crate) fn all_libraries(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .flat_map(|(dir, _)| Self::libraries_in(dir))
            .collect()
    }

    /// The plugin library files (`lib*.so`) in `dir`, sorted; none when it cannot be read.
    pub fn libraries_in(dir: &Path) -> Vec<PathBuf> {
        let Ok(read) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut files: Vec<PathBuf> = read
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                name.starts_with(std::env::consts::DLL_PREFIX)
                    && name.ends_with(std::env::consts::DLL_SUFFIX)
            })
            .collect();
        files.sort();
        files
    }
}

/// The user's plugin directory, where `cordis plugin install` puts libraries:
/// `$XDG_DATA_HOME/cordis/plugins`, else `~/.local/share/cordis/plugins`; `None` when
/// neither variable holds an absolute path (a relative `XDG_DATA_HOME` is ignored, as the
/// XDG specification says).
pub fn user_plugin_dir(env: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let absolute = |name: &str| env(name).map(PathBuf::from).filter(|p| p.is_absolute());
    absolute("XDG_DATA_HOME")
        .map(|d| d.join("cordis/plugins"))
        .or_else(|| absolute("HOME").map(|h| h.join(".local/share/cordis/plugins")))
}

/// The directories searched after the explicit ones, in order: the user's plugin
/// directory ([`user_plugin_dir`]), the installation's (`<prefix>/lib/cordis/plugins`,
/// where a release archive puts the bundled plugins) only for an installed binary (one in
/// a `<prefix>/bin` directory), and the directory of the `cordis` binary itself (cargo's
/// build output, where a checkout's plugins land). A binary cargo built in a checkout
/// (`target/<profile>/cordis`) does not search `target/lib/cordis/plugins`: nothing
/// creates that directory, so a command sandboxed in the checkout could.
pub fn standard_plugin_dirs(
    env: impl Fn(&str) -> Option<std::ffi::OsString>,
    exe: Option<&Path>,
) -> Vec<(PathBuf, &'static str)> {
    let mut dirs = Vec::new();
    if let Some(user) = user_plugin_dir(env) {
        dirs.push((user, "the user plugin directory"));
    }
    if let Some(bin) = exe.and_then(Path::parent) {
        let installed = bin
            .parent()
            .filter(|_| bin.file_name().is_some_and(|name| name == "bin"))
            .map(|prefix| prefix.join("lib/cordis/plugins"));
        if let Some(installed) = installed {
            dirs.push((installed, "the installation's plugin directory"));
        }
        dirs.push((bin.to_path_buf(), "next to the cordis binary"));
    }
    dirs
}

/// The library file cargo produces for a cdylib package: `dsh-fs` → `libdsh_fs.so`.
pub fn library_file_name(plugin: &str) -> String {
    format!(
        "{}{}{}",
        std::env::consts::DLL_PREFIX,
        plugin.replace('-', "_"),
        std::env::consts::DLL_SUFFIX
    )
}

/// A provided service as declared by a plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Registry name.
    pub name: String,
    /// Interface identity.
    pub interface: String,
    /// Interface version.
    pub version: u32,
}

impl ServiceSpec {
    /// Service `name` of interface `I` (the interface crate's typed client).
    pub fn of<I: cordis_sdk::Interface>(name: &str) -> ServiceSpec {
        ServiceSpec {
            name: name.to_string(),
            interface: I::ID.to_string(),
            version: I::VERSION,
        }
    }
}

/// An injected service as declared by a plugin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectSpec {
    /// Registry name.
    pub name: String,
    /// Interface identity.
    pub interface: String,
    /// Interface version.
    pub version: u32,
    /// May be absent.
    pub optional: bool,
}

/// A plugin's metadata, copied out of the library into host memory.
#[derive(Clone, Debug)]
pub struct Meta {
    /// Plugin name.
    pub name: String,
    /// Plugin version.
    pub version: String,
    /// One line on what it is for.
    pub description: String,
    /// Provided services.
    pub provides: Vec<ServiceSpec>,
    /// Injected services.
    pub injects: Vec<InjectSpec>,
    /// JSON Schema of the config.
    pub config_schema: serde_json::Value,
    /// The tools it declares (`None`: built before plugins could declare them; empty:
    /// declares none, e.g. because its config names them).
    pub tools: Option<Vec<String>>,
    /// The `cordis-sdk` version it was built against.
    pub sdk_version: String,
    /// What its process needs when isolated (`write-files`, `network`, `namespaces`);
    /// empty for a library built before plugins could say.
    pub needs: Vec<String>,
}

/// A loaded plugin library. The `RawLibrary` stays open as long as this value lives.
pub struct Library {
    /// The file the manifest or the search path named.
    pub path: PathBuf,
    /// What the filesystem said about the file when it was loaded (reloads compare it
    /// before comparing bytes); updated when a change turned out to leave every byte.
    identity: std::sync::Mutex<FileId>,
    /// The generation: a counter over every library this host loaded from a copy (0 when
    /// loaded in place).
    pub generation: u64,
    /// Its metadata.
    pub meta: Meta,
    module: PluginModRef,
    raw: Option<RawLibrary>,
    /// The private copy it was loaded from, removed when the library is unloaded.
    copy: Option<PathBuf>,
}

/// Where libraries are copied before loading, so that every generation is a distinct file
/// to the dynamic loader (a hard link or the same path would return the loaded one).
#[derive(Debug)]
pub struct Copies {
    dir: PathBuf,
    next: std::sync::atomic::AtomicU64,
}

impl Copies {
    /// Copies go to `dir` (created on demand).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Copies {
            dir: dir.into(),
            next: std::sync::atomic::AtomicU64::new(1),
        }
    }

    /// Copies `source` (opened from `path`) to a new file for `generation` and checks that
    /// the copy is a complete library; nothing is left behind on failure.
    fn copy(
        &self,
        path: &Path,
        generation: u64,
        source: &mut std::fs::File,
    ) -> Result<PathBuf, LoadError> {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| LoadError::Open(format!("cannot create {}: {e}", self.dir.display())))?;
        let name = path
            .file_name()
            .map_or_else(|| "plugin".into(), |n| n.to_string_lossy().into_owned());
        let copy = self.dir.join(format!("g{generation}-{name}"));
        let copied = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&copy)
            .and_then(|mut out| std::io::copy(source, &mut out).map(|_| out));
        let checked = match copied {
            Ok(out) => check_complete(&out).map_err(LoadError::Open),
            Err(e) => Err(LoadError::Open(format!(
                "cannot copy to {}: {e}",
                copy.display()
            ))),
        };
        match checked {
            Ok(()) => Ok(copy),
            Err(e) => {
                let _ = std::fs::remove_file(&copy);
                Err(e)
            }
        }
    }
}

/// Which file a library is and when it last changed, as the filesystem already knows it:
/// a generation is identified without reading its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl FileId {
    fn of(meta: &std::fs::Metadata) -> FileId {
        use std::os::unix::fs::MetadataExt;
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

/// Whether two files hold the same bytes (read in chunks, never whole).
fn same_bytes(a: &Path, b: &Path) -> std::io::Result<bool> {
    use std::io::Read;
    let (mut a, mut b) = (std::fs::File::open(a)?, std::fs::File::open(b)?);
    if a.metadata()?.len() != b.metadata()?.len() {
        return Ok(false);
    }
    let (mut x, mut y) = (vec![0u8; 64 * 1024], vec![0u8; 64 * 1024]);
    loop {
        let n = a.read(&mut x)?;
        if n == 0 {
            return Ok(b.read(&mut y[..1])? == 0);
        }
        b.read_exact(&mut y[..n])?;
        if x[..n] != y[..n] {
            return Ok(false);
        }
    }
}

impl Drop for Library {
    fn drop(&mut self) {
        drop(self.raw.take());
        let Some(copy) = self.copy.take() else { return };
        if still_loaded(&copy) {
            static PINNED: std::sync::Once = std::sync::Once::new();
            PINNED.call_once(|| {
                tracing::warn!(
                    "plugin `{}` generation {} stays in the process after unloading (it pins itself, e.g. with thread-local destructors); reloads keep working but its memory is not returned",
                    self.meta.name,
                    self.generation
                )
            });
        } else {
            tracing::debug!(plugin = %self.meta.name, generation = self.generation, "unloaded");
        }
        if let Err(e) = std::fs::remove_file(&copy) {
            tracing::debug!("cannot remove {}: {e}", copy.display());
        }
    }
}

/// Refuses a file that is not a complete ELF shared object: the dynamic loader maps a
/// truncated (half-written) library without complaint and the process dies later on a
/// missing page, so every segment and the section table must lie within the file. Reads
/// only the ELF header and the program header table.
fn check_complete(file: &std::fs::File) -> Result<(), String> {
    use std::os::unix::fs::FileExt;
    let len = file
        .metadata()
        .map_err(|e| format!("cannot stat it: {e}"))?
        .len();
    let read = |at: u64, buf: &mut [u8]| file.read_exact_at(buf, at).is_ok();
    let u16_at = |o: u64| {
        let mut b = [0u8; 2];
        read(o, &mut b).then(|| u16::from_le_bytes(b) as u64)
    };
    let u64_at = |o: u64| {
        let mut b = [0u8; 8];
        read(o, &mut b).then(|| u64::from_le_bytes(b))
    };
    let mut ident = [0u8; 6];
    if !read(0, &mut ident) || &ident[..4] != b"\x7fELF" {
        return Err("not an ELF file".into());
    }
    if ident[4] != 2 || ident[5] != 1 {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let incomplete =
        || format!("the file is incomplete ({len} bytes; truncated or still being written)");
    let (phoff, phentsize, phnum) = (u64_at(0x20), u16_at(0x36), u16_at(0x38));
    let (shoff, shentsize, shnum) = (u64_at(0x28), u16_at(0x3a), u16_at(0x3c));
    let (Some(phoff), Some(phentsize), Some(phnum), Some(shoff), Some(shentsize), Some(shnum)) =
        (phoff, phentsize, phnum, shoff, shentsize, shnum)
    else {
        return Err(incomplete());
    };
    if shoff.saturating_add(shentsize.saturating_mul(shnum)) > len
        || phoff.saturating_add(phentsize.saturating_mul(phnum)) > len
    {
        return Err(incomplete());
    }
    for i in 0..phnum {
        let at = phoff + i * phentsize;
        let (Some(offset), Some(filesz)) = (u64_at(at + 8), u64_at(at + 32)) else {
            return Err(incomplete());
        };
        if offset.saturating_add(filesz) > len {
            return Err(incomplete());
        }
    }
    Ok(())
}

/// Whether the dynamic loader still has `path` mapped (`RTLD_NOLOAD` probe).
pub(crate) fn still_loaded(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: RTLD_NOLOAD never loads; a non-null handle is released again at once.
    unsafe {
        let handle = libc::dlopen(c.as_ptr(), libc::RTLD_NOLOAD | libc::RTLD_LAZY);
        if handle.is_null() {
            false
        } else {
            libc::dlclose(handle);
            true
        }
    }
}

impl fmt::Debug for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Library")
            .field("path", &self.path)
            .field("plugin", &self.meta.name)
            .finish()
    }
}

/// Why a library could not be used.
#[derive(Debug)]
pub enum LoadError {
    /// The dynamic loader refused the file.
    Open(String),
    /// The file is a library but exports no cordis plugin.
    NotAPlugin,
    /// Built against another SDK version or with a different type layout.
    Abi {
        /// One line: what differs.
        summary: String,
        /// abi_stable's full report.
        full: String,
    },
    /// The plugin's own `metadata()` failed.
    Metadata(Box<RError>),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Open(detail) => write!(f, "the dynamic loader refused it: {detail}"),
            LoadError::NotAPlugin => {
                write!(
                    f,
                    "it is not a cordis plugin (no `export_plugin!` root module)"
                )
            }
            LoadError::Abi { summary, .. } => write!(f, "ABI mismatch: {summary}"),
            LoadError::Metadata(e) => {
                write!(f, "its metadata() failed: {} [{}]", e.message, e.code)
            }
        }
    }
}

impl Library {
    /// The file the dynamic loader opened: the private copy when there is one.
    pub fn loaded_file(&self) -> &Path {
        self.copy.as_deref().unwrap_or(&self.path)
    }
}

impl Library {
    /// Loads `path` and reads its metadata.
    pub fn load(path: &Path) -> Result<Arc<Library>, LoadError> {
        Self::load_with(path, None)
    }

    /// Loads `path`, from a fresh private copy when `copies` is given.
    ///
    /// The file is identified by its metadata, never hashed. A copy is made by the kernel
    /// (`copy_file_range`, a reflink where the filesystem can) from the descriptor whose
    /// metadata was taken, and the completeness check reads only the ELF headers of the
    /// file that is then loaded.
    pub(crate) fn load_with(
        path: &Path,
        copies: Option<&Copies>,
    ) -> Result<Arc<Library>, LoadError> {
        let mut source = std::fs::File::open(path).map_err(|e| LoadError::Open(e.to_string()))?;
        let identity = source
            .metadata()
            .map(|m| FileId::of(&m))
            .map_err(|e| LoadError::Open(e.to_string()))?;
        let (generation, copy) = match copies {
            None => {
                check_complete(&source).map_err(LoadError::Open)?;
                (0, None)
            }
            Some(c) => {
                let generation = c.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let copy = c.copy(path, generation, &mut source)?;
                (generation, Some(copy))
            }
        };
        let load_from = copy.as_deref().unwrap_or(path);
        let outcome = Self::load_file(path, load_from, identity, generation);
        match (outcome, copy) {
            (Ok(mut lib), copy) => {
                if let Some(l) = Arc::get_mut(&mut lib) {
                    l.copy = copy;
                }
                Ok(lib)
            }
            (Err(e), Some(copy)) => {
                let _ = std::fs::remove_file(copy);
                Err(e)
            }
            (Err(e), None) => Err(e),
        }
    }

    /// Whether the file at [`Library::path`] is still what this library was loaded from:
    /// the same metadata, or (when the metadata changed, e.g. the file was replaced) the
    /// same bytes as the private copy it runs from.
    pub(crate) fn unchanged_on_disk(&self) -> bool {
        let Ok(now) = std::fs::metadata(&self.path).map(|m| FileId::of(&m)) else {
            return false;
        };
        let mut identity = self.identity.lock().unwrap_or_else(|e| e.into_inner());
        if *identity == now {
            return true;
        }
        let same = self
            .copy
            .as_deref()
            .is_some_and(|copy| same_bytes(&self.path, copy).unwrap_or(false));
        if same {
            *identity = now;
        }
        same
    }

    fn load_file(
        path: &Path,
        load_from: &Path,
        identity: FileId,
        generation: u64,
    ) -> Result<Arc<Library>, LoadError> {
        let raw = RawLibrary::load_at(load_from).map_err(|e| match e {
            LibraryError::OpenError { err, .. } => LoadError::Open(err.to_string()),
            other => LoadError::Open(other.to_string()),
        })?;
        // SAFETY: the header is only used while `raw` is alive: both live in `Library`.
        let header = unsafe { lib_header_from_raw_library(&raw) }.map_err(|e| match e {
            LibraryError::GetSymbolError { .. } => LoadError::NotAPlugin,
            other => abi_error(other),
        })?;
        let plugin_sdk = VersionNumber::new(header.version_strings())
            .map_err(|e| abi_error(LibraryError::ParseVersionError(e)))?;
        let host_sdk = host_sdk();
        check_sdk_version(host_sdk, plugin_sdk).map_err(|summary| LoadError::Abi {
            full: summary.clone(),
            summary,
        })?;
        let module = header
            .init_root_module::<PluginModRef>()
            .map_err(|e| abi_error_of(e, Some(plugin_sdk)))?;
        let meta = match (module.metadata())() {
            RResult::ROk(m) => m,
            RResult::RErr(e) => return Err(LoadError::Metadata(Box::new(e))),
        };
        let copy = |s: &abi_stable::std_types::RString| s.as_str().to_owned();
        let meta = Meta {
            name: copy(&meta.name),
            version: copy(&meta.version),
            description: copy(&meta.description),
            provides: meta
                .provides
                .iter()
                .map(|p| ServiceSpec {
                    name: copy(&p.name),
                    interface: copy(&p.interface),
                    version: p.version,
                })
                .collect(),
            injects: meta
                .injects
                .iter()
                .map(|i| InjectSpec {
                    name: copy(&i.name),
                    interface: copy(&i.interface),
                    version: i.version,
                    optional: i.optional,
                })
                .collect(),
            config_schema: serde_json::from_str(&meta.config_schema)
                .unwrap_or(serde_json::Value::Null),
            tools: module
                .tools()
                .map(|tools| tools().iter().map(copy).collect()),
            needs: needs_of(&raw),
            sdk_version: format!(
                "{}.{}.{}",
                plugin_sdk.major, plugin_sdk.minor, plugin_sdk.patch
            ),
        };
        Ok(Arc::new(Library {
            path: path.to_path_buf(),
            identity: std::sync::Mutex::new(identity),
            generation,
            meta,
            module,
            raw: Some(raw),
            copy: None,
        }))
    }

    /// Checks a config (JSON) with the plugin's own deserializer, without applying.
    pub fn check_config(&self, config: &str) -> Result<(), Box<RError>> {
        (self.module.check_config())(RStr::from(config))
            .into_result()
            .map_err(Box::new)
    }

    /// The root module (to apply the plugin).
    pub(crate) fn module(&self) -> PluginModRef {
        self.module
    }
}

/// The cordis-sdk version this host was built with.
/// The `cordis-sdk` release this host was built with (what a library's SDK is checked
/// against).
pub fn sdk_version() -> String {
    host_sdk().to_string()
}

/// What the library's plugin needs when isolated: its optional `NEEDS_SYMBOL` export
/// (none for a library built before it existed).
fn needs_of(raw: &RawLibrary) -> Vec<String> {
    type Needs = extern "C" fn() -> *const std::os::raw::c_char;
    // SAFETY: `export_plugin!` defines the symbol with this signature; the string it
    // returns is leaked by the library and read before anything else runs in it.
    let text = unsafe {
        let Ok(f) = raw.get::<Needs>(cordis_sdk::abi::NEEDS_SYMBOL) else {
            return Vec::new();
        };
        let ptr = (*f)();
        if ptr.is_null() {
            return Vec::new();
        }
        std::ffi::CStr::from_ptr(ptr).to_string_lossy().into_owned()
    };
    text.split(',')
        .filter(|n| !n.is_empty())
        .take(16)
        .map(str::to_string)
        .collect()
}

fn host_sdk() -> VersionNumber {
    VersionNumber::new(<PluginModRef as RootModule>::VERSION_STRINGS)
        .expect("cordis-sdk's own version is a semver version")
}

/// The ABI version a cordis-sdk version speaks: its major, or for `0.x` its `0.minor`.
fn abi_version(v: &VersionNumber) -> String {
    if v.major == 0 {
        format!("0.{}", v.minor)
    } else {
        v.major.to_string()
    }
}

/// The SDK rule, checked before abi_stable's own checks so a plugin built against another
/// SDK release is told which rule its version breaks, with both versions: it must speak the
/// host's ABI (the same major version, or minor below 1.0), and be built against the host's
/// SDK release or a later one of that ABI (the rule abi_stable applies to the versions of
/// the types' crate: the host's types may not be newer than the plugin's).
fn check_sdk_version(host: VersionNumber, plugin: VersionNumber) -> Result<(), String> {
    let (h, p) = (abi_version(&host), abi_version(&plugin));
    if h != p {
        return Err(format!(
            "the plugin was built against cordis-sdk {plugin} (ABI {p}), this host against cordis-sdk {host} (ABI {h}); rebuild the plugin with its `cordis-sdk` dependency set to the host's SDK ({h}), or run a cordis built with the plugin's SDK (a plugin must speak its host's ABI: the SDK's major version, or its minor version below 1.0)"
        ));
    }
    if !host.is_compatible(plugin) {
        return Err(format!(
            "the plugin was built against cordis-sdk {plugin}, an older release of ABI {h} than this host's cordis-sdk {host}; rebuild the plugin against cordis-sdk {host} or later (`cargo update -p cordis-sdk`) (a plugin's SDK release may be the host's or a later one of the same ABI, never an earlier one)"
        ));
    }
    Ok(())
}

fn abi_error(e: LibraryError) -> LoadError {
    abi_error_of(e, None)
}

/// `e` as a load error; `plugin_sdk` is the plugin's SDK version when it was read.
fn abi_error_of(e: LibraryError, plugin_sdk: Option<VersionNumber>) -> LoadError {
    let full = e.to_string();
    let summary = match &e {
        LibraryError::IncompatibleVersionNumber {
            expected_version,
            actual_version,
            ..
        } => check_sdk_version(*expected_version, *actual_version)
            .err()
            .unwrap_or_else(|| full.lines().next().unwrap_or("").to_string()),
        LibraryError::AbiInstability(_) => format!(
            "the plugin's ABI types differ in layout from this host's although both SDK releases speak the same ABI (the plugin: cordis-sdk {}, this host: cordis-sdk {}); rebuild the plugin against exactly the host's cordis-sdk (`--verbose` shows the layout report)",
            plugin_sdk.map_or_else(|| "unknown".to_string(), |v| v.to_string()),
            host_sdk()
        ),
        LibraryError::InvalidAbiHeader(_) => {
            "the library was built with an incompatible abi_stable".to_string()
        }
        _ => full.lines().next().unwrap_or("unknown ABI error").to_string(),
    };
    LoadError::Abi { summary, full }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &'static str) -> VersionNumber {
        VersionNumber::new(abi_stable::sabi_types::VersionStrings::new(s)).unwrap()
    }

    /// Each rule is named with both versions; what the rule allows passes.
    #[test]
    fn sdk_versions_are_checked_by_abi_then_release() {
        assert_eq!(check_sdk_version(v("0.1.0"), v("0.1.0")), Ok(()));
        assert_eq!(check_sdk_version(v("0.1.0"), v("0.1.7")), Ok(()));
        assert_eq!(check_sdk_version(v("1.2.0"), v("1.3.1")), Ok(()));
        let other_abi = check_sdk_version(v("0.1.0"), v("0.2.0")).unwrap_err();
        assert!(
            other_abi.contains(
                "cordis-sdk 0.2.0 (ABI 0.2), this host against cordis-sdk 0.1.0 (ABI 0.1)"
            ) && other_abi.contains("must speak its host's ABI"),
            "{other_abi}"
        );
        let older = check_sdk_version(v("0.1.5"), v("0.1.2")).unwrap_err();
        assert!(
            older.contains(
                "cordis-sdk 0.1.2, an older release of ABI 0.1 than this host's cordis-sdk 0.1.5"
            ) && older.contains("never an earlier one"),
            "{older}"
        );
        let older = check_sdk_version(v("1.3.0"), v("1.2.9")).unwrap_err();
        assert!(older.contains("older release of ABI 1"), "{older}");
    }

    /// The standard directories come in the documented order, `XDG_DATA_HOME` before
    /// `HOME`, a relative `XDG_DATA_HOME` ignored, and nothing made up without either.
    #[test]
    fn standard_plugin_dirs_follow_xdg_then_the_installation_then_the_binary() {
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| std::ffi::OsString::from(v))
            }
        };
        let exe = Path::new("/opt/cordis/bin/cordis");
        let dirs = |vars| -> Vec<PathBuf> {
            standard_plugin_dirs(env(vars), Some(exe))
                .into_iter()
                .map(|(d, _)| d)
                .collect()
        };
        let installed = PathBuf::from("/opt/cordis/lib/cordis/plugins");
        let bin = PathBuf::from("/opt/cordis/bin");
        assert_eq!(
            dirs(&[("XDG_DATA_HOME", "/data"), ("HOME", "/home/u")]),
            [
                PathBuf::from("/data/cordis/plugins"),
                installed.clone(),
                bin.clone()
            ]
        );
        assert_eq!(
            dirs(&[("XDG_DATA_HOME", "rel"), ("HOME", "/home/u")]),
            [
                PathBuf::from("/home/u/.local/share/cordis/plugins"),
                installed.clone(),
                bin.clone()
            ]
        );
        assert_eq!(dirs(&[]), [installed, bin]);
        // A build output is not an installation.
        let built = Path::new("/w/target/release/cordis");
        let searched: Vec<PathBuf> = standard_plugin_dirs(env(&[]), Some(built))
            .into_iter()
            .map(|(d, _)| d)
            .collect();
        assert_eq!(searched, [PathBuf::from("/w/target/release")]);
    }
}
