//! NCCL found and loaded at run time (feature `nccl`): no link-time dependency, so one
//! `andrea` binary runs where NCCL is missing (gradients then go through host memory and
//! MPI). The library is looked for, in order, at `ANDREA_NCCL_LIB` (the file, or a folder
//! holding `libnccl.so.2`), by the dynamic loader's own search (`LD_LIBRARY_PATH`, the
//! system's library folders), and in the `nvidia/nccl/lib` folder of a Python
//! `nvidia-nccl-cu13` (or `-cu12`) install: the active virtual environment, the user's
//! site-packages, the system's.
//!
//! What is loaded is checked (`ncclGetVersion`, which needs no GPU); the collective
//! entry points are resolved with it, so a library without them is refused when loaded,
//! not in the middle of a run.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};

/// The file name NCCL 2's loaders and wheels use.
pub const NCCL_SONAME: &str = "libnccl.so.2";

/// `ncclUniqueId`: 128 opaque bytes, made on one rank and broadcast to the others.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NcclUniqueId {
    pub internal: [c_char; 128],
}

type GetVersion = unsafe extern "C" fn(*mut c_int) -> c_int;
type GetUniqueId = unsafe extern "C" fn(*mut NcclUniqueId) -> c_int;
type CommInitRank = unsafe extern "C" fn(*mut *mut c_void, c_int, NcclUniqueId, c_int) -> c_int;
/// `ncclAllReduce(send, recv, count, datatype, op, comm, stream)`.
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;
type CommDestroy = unsafe extern "C" fn(*mut c_void) -> c_int;
type GetErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// A loaded NCCL: the library and the entry points andrea uses.
pub struct Nccl {
    path: PathBuf,
    version: i32,
    pub get_unique_id: GetUniqueId,
    pub comm_init_rank: CommInitRank,
    pub all_reduce: AllReduce,
    pub comm_destroy: CommDestroy,
    get_error_string: GetErrorString,
    /// Kept last: the entry points above point into it.
    _lib: libloading::Library,
}

/// Why no NCCL was loaded: every place tried, with what went wrong there.
#[derive(Debug, thiserror::Error)]
#[error(
    "NCCL ({NCCL_SONAME}) could not be loaded; tried: {}. Install it (`pip install \
     nvidia-nccl-cu13`) or set ANDREA_NCCL_LIB to the library; without it the gradients go \
     through host memory and MPI",
    .tried.join("; ")
)]
pub struct NcclNotFound {
    pub tried: Vec<String>,
}

/// Where to look, in order (see the module docs); `env` reads the environment.
pub fn candidates(env: impl Fn(&str) -> Option<String>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = env("ANDREA_NCCL_LIB").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        out.push(if p.is_dir() { p.join(NCCL_SONAME) } else { p });
    }
    // A bare name: the dynamic loader's own search.
    out.push(PathBuf::from(NCCL_SONAME));
    let mut roots: Vec<PathBuf> = Vec::new();
    if let Some(v) = env("VIRTUAL_ENV") {
        roots.push(PathBuf::from(v).join("lib"));
    }
    if let Some(h) = env("HOME") {
        roots.push(PathBuf::from(h).join(".local/lib"));
    }
    roots.extend(["/usr/local/lib", "/usr/lib"].map(PathBuf::from));
    for root in roots {
        for python in python_dirs(&root) {
            for packages in ["site-packages", "dist-packages"] {
                let lib = python
                    .join(packages)
                    .join("nvidia/nccl/lib")
                    .join(NCCL_SONAME);
                if lib.exists() {
                    out.push(lib);
                }
            }
        }
    }
    out
}

/// The `python3.*` folders of `root`, sorted.
fn python_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("python3"))
        })
        .collect();
    dirs.sort();
    dirs
}

impl Nccl {
    /// The first NCCL of [`candidates`] (this process's environment) that loads.
    pub fn load() -> Result<Nccl, NcclNotFound> {
        Self::load_from(&candidates(|v| std::env::var(v).ok()))
    }

    /// The first of `paths` that loads and has NCCL's entry points.
    pub fn load_from(paths: &[PathBuf]) -> Result<Nccl, NcclNotFound> {
        let mut tried = Vec::new();
        for path in paths {
            match Self::open(path) {
                Ok(n) => return Ok(n),
                Err(e) => tried.push(format!("{}: {e}", path.display())),
            }
        }
        Err(NcclNotFound { tried })
    }

    fn open(path: &Path) -> Result<Nccl, String> {
        // SAFETY: loading a library runs its initialisers; NCCL's only set up its
        // globals (it starts no GPU work before ncclCommInitRank).
        let lib = unsafe { libloading::Library::new(path) }.map_err(|e| e.to_string())?;
        // SAFETY: each symbol is declared with NCCL 2's C signature (nccl.h).
        unsafe {
            let get_version: GetVersion = *lib
                .get::<GetVersion>(b"ncclGetVersion\0")
                .map_err(|e| e.to_string())?;
            let mut version = 0;
            let rc = get_version(&mut version);
            if rc != 0 || version < 20000 {
                return Err(format!("ncclGetVersion returned {rc}, version {version}"));
            }
            macro_rules! sym {
                ($name:literal) => {
                    *lib.get(concat!($name, "\0").as_bytes())
                        .map_err(|e| format!("{}: {e}", $name))?
                };
            }
            Ok(Nccl {
                path: path.to_path_buf(),
                version,
                get_unique_id: sym!("ncclGetUniqueId"),
                comm_init_rank: sym!("ncclCommInitRank"),
                all_reduce: sym!("ncclAllReduce"),
                comm_destroy: sym!("ncclCommDestroy"),
                get_error_string: sym!("ncclGetErrorString"),
                _lib: lib,
            })
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `major.minor.patch`, from NCCL's code (`major·10000 + minor·100 + patch`).
    pub fn version(&self) -> (i32, i32, i32) {
        let v = self.version;
        (v / 10000, v / 100 % 100, v % 100)
    }

    /// NCCL's text for a result code.
    pub fn error_string(&self, code: i32) -> String {
        // SAFETY: NCCL returns a static NUL-terminated string for any code.
        let p = unsafe { (self.get_error_string)(code) };
        if p.is_null() {
            return format!("NCCL error {code}");
        }
        // SAFETY: non-null, NUL-terminated, static.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_start_with_the_variable_then_the_loader() {
        let env = |k: &str| (k == "ANDREA_NCCL_LIB").then(|| "/opt/x/libnccl.so.2".to_string());
        let c = candidates(env);
        assert_eq!(c[0], PathBuf::from("/opt/x/libnccl.so.2"));
        assert_eq!(c[1], PathBuf::from(NCCL_SONAME));
    }

    #[test]
    fn a_missing_library_names_every_place_tried() {
        let paths = [
            PathBuf::from("/nonexistent/libnccl.so.2"),
            PathBuf::from("/dev/null"),
        ];
        let e = Nccl::load_from(&paths).err().expect("nothing loads");
        let msg = e.to_string();
        assert!(
            msg.contains("/nonexistent/libnccl.so.2") && msg.contains("/dev/null"),
            "{msg}"
        );
        assert!(
            msg.contains("ANDREA_NCCL_LIB") && msg.contains("pip install"),
            "{msg}"
        );
    }

    /// The real library where one is installed (CI: the `nvidia-nccl-cu13` wheel, named by
    /// `ANDREA_NCCL_LIB`): it loads and reports its version without a GPU.
    #[test]
    fn loads_an_installed_nccl_and_reads_its_version() {
        match Nccl::load() {
            Ok(n) => {
                let (major, minor, patch) = n.version();
                println!("NCCL {major}.{minor}.{patch} from {}", n.path().display());
                assert_eq!(major, 2);
                assert!(!n.error_string(1).is_empty());
            }
            Err(e) if std::env::var_os("ANDREA_REQUIRE_NCCL").is_some() => {
                panic!("ANDREA_REQUIRE_NCCL is set, but {e}")
            }
            Err(e) => {
                eprintln!("SKIPPED loads_an_installed_nccl_and_reads_its_version because {e}")
            }
        }
    }
}
