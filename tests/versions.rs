//! One version everywhere: the crate, the benchmark crate, the command's, Cargo.lock, the
//! header, `tier_version()`, the Python package and the changelog's newest
//! entry say the same number, and the CMake project and pkg-config file take
//! theirs from Cargo.toml (c_tests/test_version.c checks the built
//! package's against `tier_version()`). The license the manifests declare is
//! the one in LICENSE.

use std::ffi::CStr;
use std::path::Path;

const VERSION: &str = env!("CARGO_PKG_VERSION");

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The quoted value of the first line of `text` that starts with `prefix`.
fn quoted_after(text: &str, prefix: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with(prefix))?;
    let rest = &line[line.find('"')? + 1..];
    Some(rest[..rest.find('"')?].to_string())
}

/// The `version` of a `[[package]]` entry of Cargo.lock.
fn locked_version(lock: &str, name: &str) -> Option<String> {
    let entry = lock.split("[[package]]").find(|entry| {
        entry
            .lines()
            .any(|l| l.trim() == format!("name = \"{name}\""))
    })?;
    quoted_after(entry.trim_start(), "version = ")
}

#[test]
fn every_manifest_and_the_library_say_the_crate_version() {
    let found = [
        (
            "bench/Cargo.toml",
            quoted_after(&read("bench/Cargo.toml"), "version = "),
        ),
        (
            "Cargo.lock (kvtier)",
            locked_version(&read("Cargo.lock"), "kvtier"),
        ),
        (
            "Cargo.lock (kvtier-bench)",
            locked_version(&read("Cargo.lock"), "kvtier-bench"),
        ),
        (
            "cli/Cargo.toml",
            quoted_after(&read("cli/Cargo.toml"), "version = "),
        ),
        (
            "Cargo.lock (kvtier-cli)",
            locked_version(&read("Cargo.lock"), "kvtier-cli"),
        ),
        (
            "include/kvtier.h",
            quoted_after(&read("include/kvtier.h"), "#define KVTIER_VERSION_STRING "),
        ),
        (
            "python/kvtier/__init__.py",
            quoted_after(&read("python/kvtier/__init__.py"), "__version__ = "),
        ),
        (
            "tier_version()",
            Some(
                unsafe { CStr::from_ptr(kvtier::ffi::tier_version()) }
                    .to_str()
                    .expect("UTF-8")
                    .to_string(),
            ),
        ),
    ];
    for (place, version) in found {
        assert_eq!(
            version.as_deref(),
            Some(VERSION),
            "{place} does not say version {VERSION} (Cargo.toml's)"
        );
    }
}

#[test]
fn the_changelog_opens_with_this_version() {
    let changelog = read("CHANGELOG.md");
    let newest = changelog
        .lines()
        .find_map(|l| l.strip_prefix("## "))
        .expect("CHANGELOG.md has a `## <version>` entry");
    assert_eq!(
        newest.split_whitespace().next(),
        Some(VERSION),
        "CHANGELOG.md's newest entry is {newest:?}; add one for {VERSION}"
    );
}

#[test]
fn cmake_pkg_config_and_python_take_the_version_from_one_place() {
    let cmake = read("CMakeLists.txt");
    assert!(
        cmake.contains(
            "file(STRINGS \"${CMAKE_CURRENT_SOURCE_DIR}/Cargo.toml\" _kvtier_version_line"
        ) && cmake.contains("project(kvtier VERSION ${_kvtier_version}"),
        "CMakeLists.txt no longer reads its project version from Cargo.toml"
    );
    assert!(
        read("cmake/kvtier.pc.in").contains("\nVersion: @PROJECT_VERSION@\n"),
        "kvtier.pc no longer takes the CMake project's version"
    );
    let pyproject = read("python/pyproject.toml");
    assert!(
        pyproject.contains("dynamic = [\"version\"]")
            && pyproject.contains("version = { attr = \"kvtier.__version__\" }"),
        "python/pyproject.toml no longer takes its version from kvtier.__version__"
    );
}

#[test]
fn the_declared_license_is_the_one_shipped() {
    assert_eq!(
        quoted_after(&read("Cargo.toml"), "license = ").as_deref(),
        Some("Apache-2.0")
    );
    assert!(read("python/pyproject.toml").contains("\nlicense = \"Apache-2.0\"\n"));
    let license = read("LICENSE");
    assert!(
        license.contains("Apache License") && license.contains("Version 2.0, January 2004"),
        "LICENSE is not the Apache License 2.0"
    );
}
