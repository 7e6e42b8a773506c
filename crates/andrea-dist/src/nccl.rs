//! NCCL found and loaded at run time (feature `nccl`): no link-time dependency, so one
//! `andrea` binary runs where NCCL is missing (gradients then go through host memory and
//! MPI). The library is looked for, in order, at `ANDREA_NCCL_LIB` (the file, or a folder
//! holding `libnccl.so.2`), by the dynamic loader's own search (`LD_LIBRARY_PATH`, the
//! system's library folders), and in the `nvidia/nccl/lib` folder of a Python
//! `nvidia-nccl-cu13` (or `-cu12`) install: the active virtual environment, the user's
//! site-packages, the system's.
//!
//! [`NcclComm`] is a communicator over the ranks of a [`World`]: rank 0 makes the
//! unique id, MPI broadcasts it, every rank calls `ncclCommInitRank`. A world of one
//! needs no MPI (its own id), so a single GPU can run NCCL's path.
//!
//! What is loaded is checked (`ncclGetVersion`, which needs no GPU); the collective
//! entry points are resolved with it, so a library without them is refused when loaded,
//! not in the middle of a run.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::World;

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

    /// The stand-in NCCL of the CUDA emulator (`cargo xtask cuda-emu`), whose "device"
    /// memory is host memory: a communicator of one rank sums in place (the identity),
    /// and a failing call's error carries NCCL's own text for its code.
    #[test]
    fn a_world_of_one_reduces_in_place_and_errors_say_what_nccl_says() {
        let standin = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../target/cuda-emu/nccl")
            .join(NCCL_SONAME);
        if !standin.exists() {
            return eprintln!(
                "SKIPPED a_world_of_one_reduces_in_place_and_errors_say_what_nccl_says because \
                 {} is missing (cargo xtask cuda-emu builds it)",
                standin.display()
            );
        }
        let nccl = Arc::new(Nccl::load_from(&[standin]).expect("the stand-in loads"));
        assert_eq!(nccl.version(), (2, 99, 0));
        let comm = NcclComm::init(nccl.clone(), &World::solo()).expect("one rank");
        assert_eq!((comm.rank(), comm.size()), (0, 1));
        let mut x = vec![1.5f32, -2.0, 3.25];
        // SAFETY: the stand-in reads and writes host memory; `x` outlives the call.
        unsafe { comm.all_reduce_sum_in_place(x.as_mut_ptr() as u64, x.len(), 0) }.unwrap();
        assert_eq!(x, [1.5, -2.0, 3.25]);
        // A communicator whose id was never made by ncclGetUniqueId.
        let mut raw = std::ptr::null_mut();
        let bad = NcclUniqueId { internal: [0; 128] };
        // SAFETY: out-pointer and a by-value id.
        let rc = unsafe { (nccl.comm_init_rank)(&mut raw, 1, bad, 0) };
        let e = nccl.check("ncclCommInitRank", rc).unwrap_err().to_string();
        assert!(
            e.contains("ncclCommInitRank") && e.contains("invalid argument"),
            "{e}"
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

/// `ncclFloat32` and `ncclSum` (nccl.h's `ncclDataType_t` and `ncclRedOp_t`).
const NCCL_FLOAT32: c_int = 7;
const NCCL_SUM: c_int = 0;

/// An NCCL call that failed: the call and NCCL's own words for its result.
#[derive(Debug, thiserror::Error)]
#[error("NCCL {call} failed: {text} (ncclResult_t {code}){hint}")]
pub struct NcclError {
    pub call: &'static str,
    pub code: i32,
    pub text: String,
    hint: &'static str,
}

/// A communicator over every rank of a world, on the current CUDA device.
pub struct NcclComm {
    nccl: Arc<Nccl>,
    comm: *mut c_void,
    rank: usize,
    size: usize,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time (it is
// not shared: `NcclComm` is not `Sync`).
unsafe impl Send for NcclComm {}

impl NcclComm {
    /// Every rank of `world` calls this at the same point (a collective): rank 0 makes
    /// the id, MPI broadcasts it, each rank joins with `ncclCommInitRank` on the CUDA
    /// device whose context is current on this thread.
    pub fn init(nccl: Arc<Nccl>, world: &World) -> Result<NcclComm, NcclError> {
        let mut id = NcclUniqueId { internal: [0; 128] };
        let mut made = 0;
        if world.is_root() {
            // SAFETY: `id` is a valid out-pointer of NCCL's id type.
            made = unsafe { (nccl.get_unique_id)(&mut id) };
        }
        // Every rank learns rank 0's result before it would wait in the init.
        let mut code = [made as f64];
        world.sum_f64(&mut code);
        nccl.check("ncclGetUniqueId", code[0] as i32)?;
        let mut bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
        world.broadcast_bytes(&mut bytes);
        for (c, b) in id.internal.iter_mut().zip(&bytes) {
            *c = *b as c_char;
        }
        let mut comm = std::ptr::null_mut();
        // SAFETY: `comm` is an out-pointer; the id came from rank 0's ncclGetUniqueId.
        let rc = unsafe {
            (nccl.comm_init_rank)(&mut comm, world.size() as c_int, id, world.rank() as c_int)
        };
        nccl.check("ncclCommInitRank", rc)?;
        Ok(NcclComm {
            nccl,
            comm,
            rank: world.rank(),
            size: world.size(),
        })
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn size(&self) -> usize {
        self.size
    }

    pub fn nccl(&self) -> &Nccl {
        &self.nccl
    }

    /// `x = Σ_ranks x` over `len` floats at device address `ptr`, in place, queued on
    /// `stream` (ordered after the work already on it, before the work queued after).
    ///
    /// # Safety
    /// `ptr .. ptr + 4·len` must be device memory of this communicator's device that
    /// stays allocated until `stream` has run the reduction; `stream` a live stream.
    pub unsafe fn all_reduce_sum_in_place(
        &self,
        ptr: u64,
        len: usize,
        stream: usize,
    ) -> Result<(), NcclError> {
        let p = ptr as *mut c_void;
        // SAFETY: the caller's contract; send == recv is NCCL's in-place form.
        let rc = unsafe {
            (self.nccl.all_reduce)(
                p,
                p,
                len,
                NCCL_FLOAT32,
                NCCL_SUM,
                self.comm,
                stream as *mut c_void,
            )
        };
        self.nccl.check("ncclAllReduce", rc)
    }
}

impl Drop for NcclComm {
    fn drop(&mut self) {
        // SAFETY: made by ncclCommInitRank, destroyed once.
        unsafe { (self.nccl.comm_destroy)(self.comm) };
    }
}

impl Nccl {
    fn check(&self, call: &'static str, code: i32) -> Result<(), NcclError> {
        if code == 0 {
            return Ok(());
        }
        // 1 unhandled CUDA error, 2 system error, 3 internal, 6 remote (another rank).
        let hint = match code {
            1 => ": a CUDA call inside NCCL failed; NCCL_DEBUG=WARN names it",
            2 | 6 => ": NCCL_DEBUG=WARN says which rank or connection failed",
            _ => "",
        };
        Err(NcclError {
            call,
            code,
            text: self.error_string(code),
            hint,
        })
    }
}
