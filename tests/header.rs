//! The committed header must be exactly what the code generates.

use std::path::Path;

#[test]
fn committed_header_matches_generated() {
    let generated =
        std::fs::read_to_string(env!("KVTIER_GENERATED_HEADER")).expect("generated header");
    let committed_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("include/kvtier.h");
    if std::env::var_os("KVTIER_BLESS_HEADER").is_some() {
        std::fs::write(&committed_path, &generated).expect("write include/kvtier.h");
        return;
    }
    let committed = std::fs::read_to_string(&committed_path).unwrap_or_default();
    if committed != generated {
        let first_diff = committed
            .lines()
            .zip(generated.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(committed.lines().count().min(generated.lines().count()));
        panic!(
            "include/kvtier.h is out of date with src/ffi (first difference at line {}).\n\
             Regenerate it with: KVTIER_BLESS_HEADER=1 cargo test --test header",
            first_diff + 1
        );
    }
}

#[test]
fn header_declares_every_export_and_the_version() {
    let header = std::fs::read_to_string(env!("KVTIER_GENERATED_HEADER")).unwrap();
    for name in [
        "tier_version",
        "tier_status_str",
        "tier_last_error",
        "tier_config_new",
        "tier_config_set",
        "tier_config_free",
        "tier_new",
        "tier_free",
        "tier_lookup",
        "tier_touch",
        "tier_submit_store",
        "tier_submit_load",
        "tier_poll_finished",
        "tier_wait",
        "tier_drain",
        "tier_clear",
        "tier_stats",
        "tier_describe",
        "tier_abi_info",
    ] {
        assert!(
            header.contains(&format!("{name}(")),
            "{name} missing from the header"
        );
    }
    let version = env!("CARGO_PKG_VERSION");
    assert!(header.contains(&format!("#define KVTIER_VERSION_STRING \"{version}\"")));
    assert!(header.contains("#define TIER_ERR_NULL_ARG (-1)"));
    assert!(header.contains(&format!(
        "#define TIER_ABI_VERSION {}",
        kvtier::ffi::TIER_ABI_VERSION
    )));
}
