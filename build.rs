//! Generates the C header from src/ffi into OUT_DIR (never into the source
//! tree: the committed include/kvtier.h is compared against it by a test).

use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("out dir"));
    println!("cargo:rerun-if-changed=cbindgen.toml");
    println!("cargo:rerun-if-changed=src/ffi");
    println!("cargo:rerun-if-changed=src/stats.rs");
    println!("cargo:rerun-if-changed=src/status.rs");
    println!("cargo:rerun-if-changed=src/codes.rs");

    let version = std::env::var("CARGO_PKG_VERSION").expect("version");
    let part = |name: &str| std::env::var(name).expect("version part");
    // ELF soname with the ABI version, not the package's: programs record
    // libkvtier.so.ABI in DT_NEEDED, so a compatible update replaces the
    // library in place and an incompatible one is refused by the loader.
    // (The KVTIER_<abi> version node cannot be set here: rustc's own version
    // script wins, so CMake relinks the shipped library with abi/kvtier.map.)
    if !matches!(
        std::env::var("CARGO_CFG_TARGET_OS").as_deref(),
        Ok("macos" | "ios" | "windows")
    ) {
        println!(
            "cargo:rustc-cdylib-link-arg=-Wl,-soname,libkvtier.so.{}",
            abi_version(&root)
        );
    }
    let mut config =
        cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    config.after_includes = Some(format!(
        "\n/** The version of this header; tier_version() gives the library's. */\n\
         #define KVTIER_VERSION_MAJOR {}\n#define KVTIER_VERSION_MINOR {}\n#define KVTIER_VERSION_PATCH {}\n\
         #define KVTIER_VERSION_STRING \"{version}\"\n",
        part("CARGO_PKG_VERSION_MAJOR"),
        part("CARGO_PKG_VERSION_MINOR"),
        part("CARGO_PKG_VERSION_PATCH"),
    ));
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        // The status codes are the core's own (error kinds take their numbers
        // from them), exported as they are.
        .with_src(root.join("src/status.rs"))
        // So are the other code families (job failure reasons, lookup
        // states, job kinds, events), which the core's enums name.
        .with_src(root.join("src/codes.rs"))
        .with_src(root.join("src/ffi/mod.rs"))
        // The stats struct is the core's own, exported as is.
        .with_src(root.join("src/stats.rs"))
        .generate()
        .expect("cbindgen could not generate the header");
    let mut text = Vec::new();
    bindings.write(&mut text);
    let text = String::from_utf8(text).expect("header is UTF-8");
    // cbindgen writes `#define X -1`; unparenthesized, `a-X` would expand to
    // `a--1`. Parenthesize negative values.
    let text: String = text
        .lines()
        .map(|line| {
            match line
                .strip_prefix("#define ")
                .and_then(|r| r.split_once(" -"))
            {
                Some((name, value)) if value.chars().all(|c| c.is_ascii_digit()) => {
                    format!("#define {name} (-{value})\n")
                }
                _ => format!("{line}\n"),
            }
        })
        .collect();
    std::fs::write(out.join("kvtier.h"), text).expect("write header");
    println!(
        "cargo:rustc-env=KVTIER_GENERATED_HEADER={}",
        out.join("kvtier.h").display()
    );
}

/// TIER_ABI_VERSION as src/ffi/types.rs defines it (CMake reads the same
/// line), so the soname cannot drift from the constant.
fn abi_version(root: &std::path::Path) -> u32 {
    let types = std::fs::read_to_string(root.join("src/ffi/types.rs")).expect("src/ffi/types.rs");
    types
        .lines()
        .find_map(|l| l.strip_prefix("pub const TIER_ABI_VERSION: u32 = "))
        .and_then(|v| v.strip_suffix(';'))
        .and_then(|v| v.parse().ok())
        .expect("src/ffi/types.rs: a `pub const TIER_ABI_VERSION: u32 = N;` line")
}
