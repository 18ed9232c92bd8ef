//! What the trace files a user read passed, kept on disk between runs.
//!
//! The checks of an untrusted file (`checked`) cost seconds on a large
//! trace: 4.4 s of a 10M-call file's first `memory --at` is its
//! `quick_check` and the pass over its call rows. A command line that asks
//! several questions about one file (`memory --at`, then `report`, then
//! `query`) paid them on every run. [`CheckCache`] keeps what a file passed
//! in a small JSON file of the user's cache directory, keyed by the same
//! [`FileIdentity`] the in-process memo uses (device, inode, size,
//! modification and change times of the database and its `-wal`): any
//! write to the trace changes its change time, which its owner cannot set
//! back, so a changed file is a new key and is checked again.
//!
//! The cache lets a reader skip checks, so only its user may have written
//! it: the directory and the file must belong to the effective user and be
//! writable by no one else (a root reader under `sudo` with another user's
//! `HOME` uses no cache rather than that user's), the file is opened
//! without following a link, and anything unexpected in it (too large, not
//! parseable, another format or build) makes it an empty cache. Writes go
//! to a private temporary file renamed over the old one, so a reader never
//! sees half a cache; two runs saving at once lose at most one's news
//! (a check paid again, never a wrong skip).
//!
//! Where: `$GPUSLEUTH_CACHE_DIR` (an empty value: no cache), else
//! `$XDG_CACHE_HOME/gpusleuth`, else `$HOME/.cache/gpusleuth`; the file is
//! `checks.json`.

use crate::checked::{FileIdentity, Passed};
use crate::open::BULK_TABLES;
use crate::problems::{CallScan, InputProblems};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::fs::{DirBuilder, File, Metadata, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Files kept: a user reads a few traces at a time, but a `trace --rotate`
/// run is many files that its readers open together (64 kept files made
/// every command over a run of more re-check the ones pushed out, round 38).
/// The least recently used ones are forgotten (and checked again if read
/// again).
pub(crate) const KEPT: usize = 1024;

/// A cache file larger than this is not ours (1024 entries of plain files
/// take ~360 KB; a save keeps under it by dropping the oldest).
const MAX_BYTES: u64 = 1 << 20;

/// The cache's format. Bump it whenever what a check covers or what a pass
/// computes changes: entries written by another format are not trusted.
const FORMAT: u32 = 1;

/// The file name inside the cache directory.
const FILE_NAME: &str = "checks.json";

/// The environment variable naming the directory (empty: no cache).
pub const CACHE_DIR_ENV: &str = "GPUSLEUTH_CACHE_DIR";

/// The build the entries were written by: the version, the cache format and
/// the tables checked on first read (a table moved in or out of that list
/// changes what "the other tables passed" means).
fn build() -> String {
    format!(
        "{} f{FORMAT} {}",
        env!("CARGO_PKG_VERSION"),
        BULK_TABLES.join(",")
    )
}

/// The cache file of one user.
#[derive(Debug, Clone)]
pub(crate) struct CheckCache {
    dir: PathBuf,
    /// Named by `$GPUSLEUTH_CACHE_DIR`: created wherever asked (the user
    /// chose it), not only under a parent the user owns.
    named: bool,
}

/// One remembered file, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct StoredEntry {
    pub id: FileIdentity,
    pub passed: StoredPassed,
    /// When a run last used or learnt it (seconds since the epoch).
    pub used_s: u64,
}

/// [`Passed`] as stored: bulk tables by name (mapped back onto the static
/// names of this build, an unknown one dropped).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub(crate) struct StoredPassed {
    whole: bool,
    others: bool,
    bulk: Vec<String>,
    call_scan: Option<CallScan>,
    problems: Option<InputProblems>,
}

impl StoredPassed {
    pub(crate) fn of(p: &Passed) -> StoredPassed {
        StoredPassed {
            whole: p.whole,
            others: p.others,
            bulk: p.bulk.iter().map(|s| s.to_string()).collect(),
            call_scan: p.call_scan,
            problems: p.problems.clone(),
        }
    }

    /// Whether nothing passed (not worth keeping).
    pub(crate) fn is_empty(&self) -> bool {
        *self == StoredPassed::default()
    }

    /// Back into the reader's form. `bulk_done` is not kept: the tables a
    /// file has are read again (one look at its schema) and only those not
    /// named here are checked.
    pub(crate) fn passed(&self) -> Passed {
        let mut p = Passed {
            whole: self.whole,
            others: self.others,
            call_scan: self.call_scan,
            problems: self.problems.clone(),
            ..Passed::default()
        };
        for name in &self.bulk {
            p.pass_table(name);
        }
        p
    }
}

/// The whole file.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    build: String,
    files: Vec<StoredEntry>,
}

impl CheckCache {
    /// The user's cache, from the environment (see the module's
    /// documentation); None when there is none to use.
    pub(crate) fn from_env() -> Option<CheckCache> {
        let var = std::env::var_os;
        let named = var(CACHE_DIR_ENV).is_some();
        dir_from(var(CACHE_DIR_ENV), var("XDG_CACHE_HOME"), var("HOME"))
            .map(|dir| CheckCache { dir, named })
    }

    /// A cache in `dir`, as if named by `$GPUSLEUTH_CACHE_DIR` (tests).
    #[cfg(test)]
    pub(crate) fn at(dir: PathBuf) -> CheckCache {
        CheckCache { dir, named: true }
    }

    fn file(&self) -> PathBuf {
        self.dir.join(FILE_NAME)
    }

    /// The entries written by this build; none when the cache is missing,
    /// not private to this user, or not one this build wrote.
    pub(crate) fn load(&self) -> Vec<StoredEntry> {
        self.try_load().unwrap_or_default()
    }

    fn try_load(&self) -> Option<Vec<StoredEntry>> {
        if !private_dir(&std::fs::symlink_metadata(&self.dir).ok()?) {
            return None;
        }
        let mut f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
            .open(self.file())
            .ok()?;
        let meta = f.metadata().ok()?;
        if !meta.is_file() || !private(&meta) || meta.len() > MAX_BYTES {
            return None;
        }
        let mut text = String::new();
        Read::by_ref(&mut f)
            .take(MAX_BYTES)
            .read_to_string(&mut text)
            .ok()?;
        let stored: Stored = serde_json::from_str(&text).ok()?;
        (stored.build == build()).then_some(stored.files)
    }

    /// Saves `entries` merged with what the cache holds now (another run
    /// may have saved since this one loaded): the same file's entry from
    /// `entries` wins, the `KEPT` most recently used are kept. Best effort:
    /// a cache that cannot be written only costs checks paid again.
    pub(crate) fn save(&self, entries: Vec<StoredEntry>) {
        let _ = self.try_save(entries);
    }

    fn try_save(&self, entries: Vec<StoredEntry>) -> Option<()> {
        self.make_dir()?;
        let mut all = self.load();
        all.retain(|old| !entries.iter().any(|e| e.id == old.id));
        all.extend(entries);
        all.sort_by_key(|e| std::cmp::Reverse(e.used_s));
        all.truncate(KEPT);
        let mut stored = Stored {
            build: build(),
            files: all,
        };
        let text = loop {
            let text = serde_json::to_string(&stored).ok()?;
            // A cache over the read limit would be read as none: the newest
            // entries that fit (files with many unknown op names are larger).
            if text.len() as u64 <= MAX_BYTES || stored.files.is_empty() {
                break text;
            }
            stored.files.truncate(stored.files.len() / 2);
        };
        // One temporary name per save, not per process: two threads of one
        // process may save at once (the MCP server's check ahead and a tool
        // call; the tracer's checking thread), and with a shared name one
        // could remove or rename the other's half-written file.
        static SAVES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SAVES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!("{FILE_NAME}.{}.{n}.tmp", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        let written = write_private(&tmp, text.as_bytes())
            .and_then(|()| std::fs::rename(&tmp, self.file()).ok());
        if written.is_none() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// Whether saving can work: the directory is there, or could be made,
    /// private to this user (it is made now). A tracer asks before paying
    /// checks only a save would make worth it (not under `sudo` with another
    /// user's `HOME`, nor in a home mounted read-only).
    pub(crate) fn usable(&self) -> bool {
        self.make_dir().is_some()
    }

    /// The directory, created private (0700) where missing: one the user
    /// named wherever asked; the default only under a parent this user owns
    /// (never in another user's home, as under `sudo` with their `HOME`).
    fn make_dir(&self) -> Option<()> {
        if self.named && std::fs::symlink_metadata(&self.dir).is_err() {
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&self.dir)
                .ok()?;
        }
        if std::fs::symlink_metadata(&self.dir).is_err() {
            let parent = self.dir.parent()?;
            if std::fs::symlink_metadata(parent).is_err() {
                // `~/.cache` itself may be missing: created under a home
                // this user owns.
                let home = parent.parent()?;
                if !owned(&std::fs::symlink_metadata(home).ok()?) {
                    return None;
                }
                DirBuilder::new().mode(0o700).create(parent).ok()?;
            }
            if !owned(&std::fs::symlink_metadata(parent).ok()?) {
                return None;
            }
            DirBuilder::new().mode(0o700).create(&self.dir).ok()?;
        }
        private_dir(&std::fs::symlink_metadata(&self.dir).ok()?).then_some(())
    }
}

/// The cache directory from the values of `$GPUSLEUTH_CACHE_DIR`,
/// `$XDG_CACHE_HOME` and `$HOME` (see the module's documentation).
fn dir_from(
    cache_dir: Option<OsString>,
    xdg_cache_home: Option<OsString>,
    home: Option<OsString>,
) -> Option<PathBuf> {
    if let Some(d) = cache_dir {
        return (!d.is_empty()).then(|| PathBuf::from(d));
    }
    let absolute = |v: Option<OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    let base = absolute(xdg_cache_home).or_else(|| absolute(home).map(|h| h.join(".cache")))?;
    Some(base.join("gpusleuth"))
}

/// Writes a new file readable and writable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> Option<()> {
    let mut f: File = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    f.write_all(bytes).ok()?;
    f.sync_all().ok()
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Owned by the effective user.
fn owned(m: &Metadata) -> bool {
    m.uid() == euid()
}

/// Owned by the effective user and writable by no one else.
fn private(m: &Metadata) -> bool {
    owned(m) && m.mode() & 0o022 == 0
}

/// A real directory (not a link to one) that is [`private`].
fn private_dir(m: &Metadata) -> bool {
    m.file_type().is_dir() && private(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("gs-cache-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    /// An entry for the file at `path` (any file: only its identity counts).
    fn entry(path: &Path, used_s: u64) -> StoredEntry {
        let mut p = Passed {
            others: true,
            call_scan: Some(CallScan {
                impossible: 3,
                totals_overflow: false,
            }),
            ..Passed::default()
        };
        p.pass_table("call_rows");
        StoredEntry {
            id: FileIdentity::of(path).expect("identity"),
            passed: StoredPassed::of(&p),
            used_s,
        }
    }

    #[test]
    fn entries_saved_are_loaded_and_merged_with_other_runs() {
        let d = dir("round");
        let cache = CheckCache::at(d.join("gpusleuth"));
        assert!(cache.load().is_empty(), "no cache yet");
        std::fs::create_dir_all(&d).expect("dir");
        let (a, b) = (d.join("a"), d.join("b"));
        std::fs::write(&a, b"a").expect("a");
        std::fs::write(&b, b"bb").expect("b");
        cache.save(vec![entry(&a, 10)]);
        let mode = std::fs::metadata(cache.file()).expect("saved").mode();
        assert_eq!(mode & 0o777, 0o600, "private file");
        let dmode = std::fs::metadata(&cache.dir).expect("dir").mode();
        assert_eq!(dmode & 0o777, 0o700, "private directory");
        // Another run saves another file: both are kept.
        CheckCache::at(cache.dir.clone()).save(vec![entry(&b, 20)]);
        let got = cache.load();
        assert_eq!(got, vec![entry(&b, 20), entry(&a, 10)]);
        let back = got[1].passed.passed();
        assert!(back.others && back.table("call_rows") && !back.table("waits"));
        assert_eq!(back.call_scan.map(|s| s.impossible), Some(3));
        let _ = std::fs::remove_dir_all(&d);
    }

    /// Entries too large for the read limit together: the newest that fit
    /// are saved, and the cache still loads.
    #[test]
    fn a_save_keeps_under_the_read_limit() {
        let d = dir("large");
        std::fs::create_dir_all(&d).expect("dir");
        let cache = CheckCache::at(d.join("c"));
        let problems = crate::problems::InputProblems {
            unknown_ops: (0..20)
                .map(|i| (format!("{i}{}", "x".repeat(2_000)), 1))
                .collect(),
            ..Default::default()
        };
        let entries: Vec<StoredEntry> = (0..100u64)
            .map(|i| {
                let p = d.join(format!("{i}"));
                std::fs::write(&p, vec![0u8; i as usize]).expect("file");
                let mut e = entry(&p, i);
                e.passed.problems = Some(problems.clone());
                e
            })
            .collect();
        cache.save(entries);
        let size = std::fs::metadata(cache.file()).expect("saved").len();
        assert!(size <= MAX_BYTES, "{size}");
        let got = cache.load();
        assert!(!got.is_empty() && got.len() < 100, "{}", got.len());
        assert_eq!(got[0].used_s, 99, "the newest kept");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_the_most_recently_used_files_are_kept() {
        let d = dir("kept");
        std::fs::create_dir_all(&d).expect("dir");
        let cache = CheckCache::at(d.join("c"));
        let entries: Vec<StoredEntry> = (0..KEPT as u64 + 5)
            .map(|i| {
                let p = d.join(format!("{i}"));
                std::fs::write(&p, vec![0u8; i as usize]).expect("file");
                entry(&p, i)
            })
            .collect();
        cache.save(entries);
        let got = cache.load();
        assert_eq!(got.len(), KEPT);
        assert_eq!(got.last().map(|e| e.used_s), Some(5), "the oldest dropped");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A cache anyone else could have written is not read (it would let
    /// them skip a file's checks), nor written into.
    #[test]
    fn a_cache_others_can_write_is_ignored() {
        let d = dir("open");
        std::fs::create_dir_all(&d).expect("dir");
        let a = d.join("a");
        std::fs::write(&a, b"a").expect("a");
        let cache = CheckCache::at(d.join("c"));
        cache.save(vec![entry(&a, 1)]);
        assert_eq!(cache.load().len(), 1);
        let set = |p: &Path, mode: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod")
        };
        set(&cache.file(), 0o622);
        assert!(cache.load().is_empty(), "group/world-writable file");
        set(&cache.file(), 0o600);
        set(&cache.dir, 0o777);
        assert!(cache.load().is_empty(), "world-writable directory");
        cache.save(vec![entry(&a, 2)]);
        set(&cache.dir, 0o700);
        assert_eq!(cache.load()[0].used_s, 1, "nothing saved into it");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_link_garbage_or_another_build_is_an_empty_cache() {
        let d = dir("odd");
        std::fs::create_dir_all(&d).expect("dir");
        let a = d.join("a");
        std::fs::write(&a, b"a").expect("a");
        let cache = CheckCache::at(d.join("c"));
        cache.save(vec![entry(&a, 1)]);
        let good = std::fs::read(cache.file()).expect("read");
        // A link to a cache is not followed.
        std::fs::rename(cache.file(), d.join("real.json")).expect("move");
        std::os::unix::fs::symlink(d.join("real.json"), cache.file()).expect("link");
        assert!(cache.load().is_empty(), "a link");
        std::fs::remove_file(cache.file()).expect("unlink");
        for bad in [
            b"{not json".to_vec(),
            String::from_utf8(good.clone())
                .expect("utf8")
                .replace(&build(), "0.0.0 f0")
                .into_bytes(),
            vec![b' '; MAX_BYTES as usize + 1],
        ] {
            std::fs::write(cache.file(), &bad).expect("write");
            std::fs::set_permissions(cache.file(), std::fs::Permissions::from_mode(0o600))
                .expect("chmod");
            assert!(cache.load().is_empty());
        }
        std::fs::write(cache.file(), &good).expect("write");
        assert_eq!(cache.load().len(), 1, "the good one reads");
        let _ = std::fs::remove_dir_all(&d);
    }

    /// The default directory is created only under a parent this user owns;
    /// a named one wherever asked.
    #[test]
    fn the_default_directory_is_made_only_in_a_home_of_this_user() {
        let d = dir("home");
        std::fs::create_dir_all(&d).expect("dir");
        let a = d.join("a");
        std::fs::write(&a, b"a").expect("a");
        let mine = CheckCache {
            dir: d.join("home/.cache/gpusleuth"),
            named: false,
        };
        std::fs::create_dir_all(d.join("home")).expect("home");
        assert!(mine.usable(), "can be made under a home this user owns");
        mine.save(vec![entry(&a, 1)]);
        assert_eq!(mine.load().len(), 1, "made under a home this user owns");
        // A home of another user (root gives one away; CI runs as root):
        // no `.cache` is made in it, where root could make one.
        if euid() == 0 {
            let other = d.join("other");
            std::fs::create_dir_all(&other).expect("other home");
            std::os::unix::fs::chown(&other, Some(65534), Some(65534)).expect("chown");
            let theirs = CheckCache {
                dir: other.join(".cache/gpusleuth"),
                named: false,
            };
            assert!(!theirs.usable(), "no cache to save into");
            theirs.save(vec![entry(&a, 1)]);
            assert!(!other.join(".cache").exists(), "nothing made in their home");
        } else {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root: the case of another user's home must run there"
            );
        }
        let named = CheckCache::at(d.join("deep/er/cache"));
        named.save(vec![entry(&a, 1)]);
        assert_eq!(
            named.load().len(),
            1,
            "a named directory is made with its parents"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_environment_names_the_directory_or_turns_the_cache_off() {
        let d = |cache: Option<&str>, xdg: Option<&str>, home: Option<&str>| {
            dir_from(
                cache.map(Into::into),
                xdg.map(Into::into),
                home.map(Into::into),
            )
        };
        assert_eq!(
            d(None, None, Some("/h")),
            Some("/h/.cache/gpusleuth".into())
        );
        assert_eq!(d(None, Some("/x"), Some("/h")), Some("/x/gpusleuth".into()));
        // A relative XDG_CACHE_HOME is ignored (the XDG rule).
        assert_eq!(
            d(None, Some("x"), Some("/h")),
            Some("/h/.cache/gpusleuth".into())
        );
        assert_eq!(d(Some("/c"), Some("/x"), Some("/h")), Some("/c".into()));
        assert_eq!(d(Some(""), None, Some("/h")), None, "turned off");
        assert_eq!(d(None, None, None), None);
        assert_eq!(d(None, None, Some("rel")), None);
    }
}
