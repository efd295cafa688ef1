//! The disk cache: its key, concurrent writers, and bad files replaced. The directory is always
//! a parameter here (never $LOCKSTEP_KERNEL_CACHE: the environment is shared by every test).

use std::sync::Barrier;

use super::*;
use crate::cubin::tiny_cubin;
use crate::tests::nvrtc_or_skip;
use crate::{ELEMENTWISE, FILL, LAYOUT, PRELUDE};

/// A fresh directory under the system's temporary directory, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(purpose: &str) -> TempDir {
        static DIRS: AtomicU64 = AtomicU64::new(0);
        let n = DIRS.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("lockstep-kernels-{purpose}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("creating a temporary directory");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_key_changes_with_the_source() {
    let options = compile_options("sm_90");
    let elementwise = ELEMENTWISE.program();
    assert!(elementwise.starts_with(PRELUDE));
    assert_ne!(
        cache_key(&elementwise, &options),
        cache_key(&LAYOUT.program(), &options)
    );
    assert_eq!(cache_key(&elementwise, &options), cache_key(&elementwise, &options));
}

#[test]
fn the_key_changes_with_the_compile_options() {
    let program = FILL.program();
    let options = compile_options("sm_90");
    let key = cache_key(&program, &options);
    let mut no_fma = options.clone();
    no_fma.retain(|o| o != "--fmad=true");
    no_fma.push("--fmad=false".into());
    let mut more = options.clone();
    more.push("-lineinfo".into());
    assert_ne!(key, cache_key(&program, &no_fma));
    assert_ne!(key, cache_key(&program, &more));
    assert_ne!(
        cache_key(&program, &["-a".into(), "b".into()]),
        cache_key(&program, &["-ab".into()])
    );
}

#[test]
fn concurrent_stores_of_one_key_never_fail_or_leave_a_part() {
    const WRITERS: usize = 8;
    const ROUNDS: usize = 25;
    let dir = TempDir::new("concurrent");
    let file = dir.0.join("kernel-sm_90-key.cubin");
    // Large enough that a write takes several syscalls, so a shared temporary would interleave.
    let cubin: Vec<u8> = (0..256 * 1024).map(|i| (i % 251) as u8).collect();
    let start = Barrier::new(WRITERS + 1);
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..WRITERS)
            .map(|_| {
                s.spawn(|| {
                    start.wait();
                    (0..ROUNDS)
                        .map(|_| store(&file, &cubin))
                        .collect::<io::Result<Vec<()>>>()
                })
            })
            .collect();
        s.spawn(|| {
            start.wait();
            while !done.load(Ordering::Relaxed) {
                match std::fs::read(&file) {
                    Ok(seen) => assert!(seen == cubin, "a reader saw {} of {} bytes", seen.len(), cubin.len()),
                    Err(e) => assert_eq!(e.kind(), io::ErrorKind::NotFound, "{e}"),
                }
            }
        });
        for writer in writers {
            let stored = writer.join().expect("a writer panicked");
            assert!(stored.is_ok(), "a store failed: {stored:?}");
        }
        done.store(true, Ordering::Relaxed);
    });
    assert!(std::fs::read(&file).expect("the cached file") == cubin);
    let left: Vec<_> = std::fs::read_dir(&dir.0)
        .expect("listing the cache")
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()
        .expect("listing the cache");
    assert_eq!(
        left,
        vec![std::ffi::OsString::from("kernel-sm_90-key.cubin")],
        "temporaries left behind"
    );
}

#[test]
fn a_bad_cached_file_is_compiled_again_and_replaced() {
    let dir = TempDir::new("replace");
    let file = dir.0.join("kernel.cubin");
    let whole = tiny_cubin();
    for bad in [b"garbage".to_vec(), vec![0u8; 4096], whole[..whole.len() - 1].to_vec()] {
        std::fs::write(&file, &bad).expect("writing a bad cache file");
        let mut compiles = 0;
        let got = cached_or_compiled(Some(&file), || {
            compiles += 1;
            Ok(whole.clone())
        });
        assert!(got.is_ok_and(|c| c == whole));
        assert_eq!(compiles, 1, "a bad file of {} bytes was used", bad.len());
        assert!(
            std::fs::read(&file).expect("the repaired file") == whole,
            "not repaired"
        );
    }
    let from_cache = cached_or_compiled(Some(&file), || panic!("a whole cached CUBIN was compiled again"));
    assert!(from_cache.is_ok_and(|c| c == whole));
}

#[test]
fn compile_cached_repairs_a_bad_cubin_on_disk() {
    if !nvrtc_or_skip() {
        return;
    }
    let dir = TempDir::new("nvrtc");
    let file = cache_file(&dir.0, &FILL, &FILL.program(), "sm_90").unwrap();
    let fill = compile(FILL.name, &FILL.program(), "sm_90").unwrap();
    for bad in [
        b"not a cubin".to_vec(),
        vec![0u8; fill.len()],
        fill[..fill.len() / 2].to_vec(),
    ] {
        std::fs::write(&file, &bad).unwrap();
        let got = compile_cached_in(Some(&dir.0), &FILL, "sm_90").unwrap();
        assert!(is_plausible_cubin(&got), "a bad file of {} bytes came back", bad.len());
        assert!(std::fs::read(&file).unwrap() == got, "the cache file was not repaired");
    }
    // A whole CUBIN on disk is what comes back: the cache is read, not bypassed.
    let other = compile(LAYOUT.name, &LAYOUT.program(), "sm_90").unwrap();
    std::fs::write(&file, &other).unwrap();
    assert!(compile_cached_in(Some(&dir.0), &FILL, "sm_90").unwrap() == other);
}
