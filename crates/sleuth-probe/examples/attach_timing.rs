//! Times loading and attaching (diagnostics): `attach_timing LIB...`
use sleuth_probe::{discover, Capture, LaunchMode};
fn main() {
    let t = std::time::Instant::now();
    let mut cap = match Capture::start(false, LaunchMode::Driver) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(1)
        }
    };
    println!("load+tracepoints: {:?}", t.elapsed());
    for p in std::env::args().skip(1) {
        let Some(lib) = discover::lib_file(std::path::Path::new(&p)) else {
            continue;
        };
        let t = std::time::Instant::now();
        let r = cap.attach_lib(&lib);
        let n = r
            .as_ref()
            .ok()
            .and_then(|a| a.as_ref())
            .map(|a| a.probes)
            .unwrap_or(0);
        println!("{p}: {n} probes in {:?} ({:?})", t.elapsed(), r.err());
    }
    let t = std::time::Instant::now();
    drop(cap);
    println!("detach all: {:?}", t.elapsed());
}
