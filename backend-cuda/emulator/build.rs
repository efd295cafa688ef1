//! Builds the emulator's four shared libraries into OUT_DIR/lib: libcuda.so (the driver API and
//! every kernel file of lockstep-kernels, compiled as C++ with cpp/kernel_dialect.h in front of
//! the prelude), libcublas.so, libcublasLt.so and libnccl.so. Without a C++ compiler the build still
//! succeeds and `install` says what is missing.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let cpp = manifest.join("cpp");
    let kernels = manifest.join("../../kernels/cuda");
    println!("cargo:rerun-if-changed=cpp");
    println!("cargo:rerun-if-changed=../../kernels/cuda");
    println!("cargo:rerun-if-env-changed=CXX");
    let lib = out.join("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let units = kernel_units(&out, &cpp, &kernels);
    // The fibers' context switch is x86-64 System V; the libraries stand in for Linux's.
    let target = (
        std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default(),
        std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default(),
    );
    let built = if target == ("linux".to_string(), "x86_64".to_string()) {
        build(&lib, &cpp, &kernels, &units)
    } else {
        Err(format!(
            "it runs on Linux x86-64 only (this is {} {})",
            target.0, target.1
        ))
    };
    let status = match built {
        Ok(()) => String::new(),
        Err(e) => {
            println!("cargo:warning=the CUDA emulator was not built: {e}");
            e
        }
    };
    println!("cargo:rustc-env=LOCKSTEP_CUDA_EMULATOR_LIB={}", lib.display());
    println!("cargo:rustc-env=LOCKSTEP_CUDA_EMULATOR_BUILD_ERROR={status}");
}

/// One generated translation unit per kernel file: the dialect, the prelude, the emulated warp
/// and asynchronous-copy instructions, the file, and a registration for each entry point it
/// defines.
fn kernel_units(out: &Path, cpp: &Path, kernels: &Path) -> Vec<PathBuf> {
    lockstep_kernels::ALL
        .iter()
        .map(|source| {
            let entries = source
                .entry_points()
                .unwrap_or_else(|e| panic!("kernels/{}.cu: {e}", source.name));
            let mut text = format!(
                "#include \"{dialect}\"\n#include \"{kernels}/prelude.cuh\"\n#include \"{warp}\"\n#include \"{copies}\"\n#include \"{kernels}/{name}.cu\"\n#include \"{registration}\"\n",
                dialect = cpp.join("kernel_dialect.h").display(),
                warp = cpp.join("warp_matrix.h").display(),
                copies = cpp.join("async_copy.h").display(),
                registration = cpp.join("registration.h").display(),
                kernels = kernels.display(),
                name = source.name,
            );
            for entry in entries {
                text.push_str(&format!("LK_KERNEL({entry})\n"));
            }
            let path = out.join(format!("kernels_{}.cpp", source.name));
            std::fs::write(&path, text).unwrap();
            path
        })
        .collect()
}

fn build(lib: &Path, cpp: &Path, kernels: &Path, units: &[PathBuf]) -> Result<(), String> {
    let compiler = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let mut driver_sources = vec![
        cpp.join("driver.cpp"),
        cpp.join("blocks.cpp"),
        cpp.join("fiber_switch.cpp"),
    ];
    driver_sources.extend(units.iter().cloned());
    // Each translation unit compiles in its own process (the kernel files are independent).
    let objects: Vec<(PathBuf, std::process::Child)> = driver_sources
        .iter()
        .chain([cpp.join("cublas.cpp"), cpp.join("cublaslt.cpp"), cpp.join("nccl.cpp")].iter())
        .map(|source| {
            let object = lib.join(source.file_stem().unwrap()).with_extension("o");
            let child = Command::new(&compiler)
                .args([
                    "-std=c++17",
                    "-O2",
                    "-fPIC",
                    "-ffp-contract=off",
                    "-fno-fast-math",
                    "-w",
                    "-c",
                ])
                .arg("-I")
                .arg(cpp)
                .arg("-I")
                .arg(kernels)
                .arg(source)
                .arg("-o")
                .arg(&object)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("could not run the C++ compiler `{compiler}` ({e}): install g++ or set CXX"))?;
            Ok((object, child))
        })
        .collect::<Result<_, String>>()?;
    let mut object_paths = Vec::new();
    for (object, child) in objects {
        let output = child.wait_with_output().map_err(|e| e.to_string())?;
        if !output.status.success() {
            let log = String::from_utf8_lossy(&output.stderr);
            let first: Vec<&str> = log.lines().filter(|l| l.contains("error")).take(3).collect();
            return Err(format!(
                "`{compiler}` failed on {}: {}",
                object.display(),
                first.join(" | ")
            ));
        }
        object_paths.push(object);
    }
    let (driver, rest) = object_paths.split_at(driver_sources.len());
    link(&compiler, lib, "libcuda.so", driver)?;
    link(&compiler, lib, "libcublas.so", &rest[..1])?;
    link(&compiler, lib, "libcublasLt.so", &rest[1..2])?;
    link(&compiler, lib, "libnccl.so", &rest[2..])?;
    Ok(())
}

/// A shared library whose SONAME is the bare name cudarc asks dlopen for, so once loaded by
/// path it answers that name.
fn link(compiler: &str, lib: &Path, name: &str, objects: &[PathBuf]) -> Result<(), String> {
    let status = Command::new(compiler)
        .args(["-shared", "-pthread"])
        .arg(format!("-Wl,-soname,{name}"))
        .args(objects)
        .arg("-o")
        .arg(lib.join(name))
        .status()
        .map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("linking {name} failed"))
    }
}
