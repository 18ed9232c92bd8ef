//! Where CUDA libraries live: explicit paths, the command's library path,
//! the usual install locations, and whatever traced processes map.

use sleuth_core::Layer;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// A CUDA library file, identified by its inode (uprobes belong to inodes).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct LibFile {
    pub path: PathBuf,
    pub layer: Layer,
    pub dev: u64,
    pub ino: u64,
}

/// Which layer a library file name belongs to, if it is one we probe.
pub fn layer_of(file_name: &str) -> Option<Layer> {
    if file_name.starts_with("libcudart.so") {
        Some(Layer::Runtime)
    } else if file_name.starts_with("libcuda.so") {
        Some(Layer::Driver)
    } else if file_name.starts_with("libc10_cuda.so") {
        Some(Layer::Torch)
    } else if file_name.starts_with("libnccl.so") {
        Some(Layer::Nccl)
    } else {
        None
    }
}

/// Identifies `path` as a CUDA library (following symlinks to the real file).
pub fn lib_file(path: &Path) -> Option<LibFile> {
    let real = std::fs::canonicalize(path).ok()?;
    let name = path.file_name()?.to_str()?;
    let real_name = real.file_name()?.to_str()?;
    let layer = layer_of(name).or_else(|| layer_of(real_name))?;
    let meta = std::fs::metadata(&real).ok()?;
    if !meta.is_file() {
        return None;
    }
    Some(LibFile {
        path: real,
        layer,
        dev: meta.dev(),
        ino: meta.ino(),
    })
}

/// CUDA libraries in one directory (not recursive).
pub fn libs_in_dir(dir: &Path) -> Vec<LibFile> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .filter(|e| e.file_name().to_str().and_then(layer_of).is_some())
        .filter_map(|e| lib_file(&e.path()))
        .collect()
}

/// The paths matching a glob pattern (`*` within a component), by the
/// `glob` crate; unreadable folders are skipped.
fn expand(pattern: &str) -> Vec<PathBuf> {
    glob::glob(pattern)
        .map(|paths| paths.flatten().collect())
        .unwrap_or_default()
}

/// Directories where CUDA runtimes and drivers are commonly installed:
/// system paths, CUDA toolkits, the NVIDIA container path, pip wheels in
/// virtual environments and user/system site-packages, and conda.
pub const STANDARD_DIRS: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/lib/x86_64-linux-gnu",
    "/usr/local/nvidia/lib64",
    "/usr/local/cuda*/lib64",
    "/usr/local/cuda*/targets/x86_64-linux/lib",
    "/opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib",
    "/opt/*/lib/python3*/site-packages/nvidia/*/lib",
    "/usr/local/lib/python3*/dist-packages/nvidia/*/lib",
    "/usr/local/lib/python3*/site-packages/nvidia/*/lib",
    "/usr/lib/python3*/dist-packages/nvidia/*/lib",
    "/root/.local/lib/python3*/site-packages/nvidia/*/lib",
    "/home/*/.local/lib/python3*/site-packages/nvidia/*/lib",
    "/opt/*/.venv/lib/python3*/site-packages/torch/lib",
    "/usr/local/lib/python3*/dist-packages/torch/lib",
    "/usr/local/lib/python3*/site-packages/torch/lib",
    "/usr/lib/python3*/dist-packages/torch/lib",
    "/root/.local/lib/python3*/site-packages/torch/lib",
    "/home/*/.local/lib/python3*/site-packages/torch/lib",
    "/opt/conda/lib",
    "/opt/conda/lib/python3*/site-packages/torch/lib",
    "/opt/conda/envs/*/lib",
];

/// This process's environment, for [`env_dirs`]: the variables whose name
/// and value are UTF-8 (no path a library could be found by is lost:
/// `PathBuf`s are made from these strings). `std::env::vars` panics on any
/// other, and took the tracer down after its capture had started, leaving
/// its file unfinished (round 55's tester: `X=$'\xff' gpusleuth trace`).
pub fn process_env() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
        .collect()
}

/// Environment-dependent directories: LD_LIBRARY_PATH entries, a virtualenv's
/// or conda env's lib folders.
pub fn env_dirs(env: &[(String, String)]) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for (k, v) in env {
        match k.as_str() {
            "LD_LIBRARY_PATH" => {
                dirs.extend(v.split(':').filter(|s| !s.is_empty()).map(PathBuf::from))
            }
            "VIRTUAL_ENV" | "CONDA_PREFIX" => {
                dirs.push(Path::new(v).join("lib"));
                // The environment's own path is literal, even with `*` or `[` in it.
                dirs.extend(expand(&format!(
                    "{}/lib/python3*/site-packages/nvidia/*/lib",
                    glob::Pattern::escape(v)
                )));
            }
            _ => {}
        }
    }
    dirs
}

/// Every CUDA library found in the standard places plus `extra_dirs`.
pub fn scan_standard(extra_dirs: &[PathBuf]) -> Vec<LibFile> {
    let mut out = BTreeSet::new();
    for d in extra_dirs {
        out.extend(libs_in_dir(d));
    }
    for pattern in STANDARD_DIRS {
        for d in expand(pattern) {
            out.extend(libs_in_dir(&d));
        }
    }
    dedup_by_inode(out.into_iter().collect())
}

/// Every process id in /proc now (the all-processes mode scans them all).
pub fn all_pids() -> Vec<u32> {
    numeric_entries("/proc")
}

/// The entries of `dir` named by a number (/proc's processes, a process's
/// `task` threads); none where it cannot be read.
pub(crate) fn numeric_entries(dir: &str) -> Vec<u32> {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// CUDA libraries a process maps, from `/proc/PID/maps`.
pub fn libs_mapped_by(pid: u32) -> Vec<LibFile> {
    let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
        return Vec::new();
    };
    let mut seen = BTreeSet::new();
    for line in maps.lines() {
        // address perms offset dev inode path
        let mut parts = line.splitn(6, ' ');
        let path = parts.nth(5).map(str::trim).unwrap_or("");
        if !path.starts_with('/') {
            continue;
        }
        let name = path.rsplit('/').next().unwrap_or("");
        if layer_of(name).is_none() {
            continue;
        }
        // A replaced library shows as "(deleted)": its old inode is gone, skip it.
        if path.ends_with(" (deleted)") {
            continue;
        }
        // Read through the process's root so libraries inside containers resolve.
        let via_root = PathBuf::from(format!("/proc/{pid}/root{path}"));
        if let Some(mut lib) = lib_file(&via_root).or_else(|| lib_file(Path::new(path))) {
            if lib.path.starts_with("/proc/") {
                lib.path = PathBuf::from(path);
            }
            seen.insert(lib);
        }
    }
    dedup_by_inode(seen.into_iter().collect())
}

fn dedup_by_inode(mut libs: Vec<LibFile>) -> Vec<LibFile> {
    libs.sort_by(|a, b| (a.dev, a.ino, &a.path).cmp(&(b.dev, b.ino, &b.path)));
    libs.dedup_by(|a, b| a.dev == b.dev && a.ino == b.ino);
    libs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_by_file_name() {
        assert_eq!(layer_of("libcudart.so.13"), Some(Layer::Runtime));
        assert_eq!(layer_of("libcudart.so"), Some(Layer::Runtime));
        assert_eq!(layer_of("libcuda.so.1"), Some(Layer::Driver));
        assert_eq!(layer_of("libcuda.so.580.159.04"), Some(Layer::Driver));
        assert_eq!(layer_of("libcudnn.so.9"), None);
        assert_eq!(layer_of("libcublas.so.13"), None);
        assert_eq!(layer_of("libc10_cuda.so"), Some(Layer::Torch));
        assert_eq!(layer_of("libc10.so"), None);
        assert_eq!(layer_of("libnccl.so.2"), Some(Layer::Nccl));
        assert_eq!(layer_of("libnccl.so.2.28.9"), Some(Layer::Nccl));
        assert_eq!(layer_of("libnccl-net.so"), None);
    }

    #[test]
    fn a_venv_path_with_glob_characters_is_taken_literally() {
        let root = std::env::temp_dir().join(format!("gs-glob-{}", std::process::id()));
        let venv = root.join("v[1]*");
        let nvidia = venv.join("lib/python3.12/site-packages/nvidia");
        for pkg in ["cublas", "cuda_runtime"] {
            std::fs::create_dir_all(nvidia.join(pkg).join("lib")).expect("mkdir");
        }
        // A sibling the pattern would match if the venv path were a glob.
        std::fs::create_dir_all(root.join("v1x/lib/python3.12/site-packages/nvidia/x/lib"))
            .expect("mkdir");
        let env = vec![("VIRTUAL_ENV".to_string(), venv.display().to_string())];
        let mut dirs = env_dirs(&env);
        dirs.sort();
        let _ = std::fs::remove_dir_all(&root);
        assert_eq!(
            dirs,
            vec![
                venv.join("lib"),
                nvidia.join("cublas/lib"),
                nvidia.join("cuda_runtime/lib")
            ]
        );
    }

    #[test]
    fn env_dirs_reads_library_path_and_envs() {
        let env = vec![
            ("LD_LIBRARY_PATH".to_string(), "/a:/b::".to_string()),
            ("VIRTUAL_ENV".to_string(), "/nonexistent-venv".to_string()),
        ];
        let dirs = env_dirs(&env);
        assert!(dirs.contains(&PathBuf::from("/a")));
        assert!(dirs.contains(&PathBuf::from("/b")));
        assert!(dirs.contains(&PathBuf::from("/nonexistent-venv/lib")));
    }

    #[test]
    fn finds_libraries_in_a_dir_and_dedups_links() {
        let dir = std::env::temp_dir().join(format!("gs-discover-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libcudart.so.13.0.1"), b"x").unwrap();
        std::os::unix::fs::symlink("libcudart.so.13.0.1", dir.join("libcudart.so.13")).unwrap();
        std::fs::write(dir.join("libcuda.so.1"), b"y").unwrap();
        std::fs::write(dir.join("libcudnn.so.9"), b"z").unwrap();
        let libs = dedup_by_inode(libs_in_dir(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(libs.len(), 2, "{libs:?}");
        assert!(libs.iter().any(|l| l.layer == Layer::Runtime));
        assert!(libs.iter().any(|l| l.layer == Layer::Driver));
    }
}
