//! Every operation of the `Backend` trait, and every variant of the op enums, has a conformance
//! case; every op a case names exists.

use std::collections::BTreeSet;

use lockstep_core::backend::{BinaryOp, CmpOp, ReduceKind, UnaryOp};
use lockstep_core::conformance::{self, NON_OP_METHODS};

/// The names of the methods declared in `pub trait Backend { … }`, read from the source.
fn backend_methods() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/backend/mod.rs");
    let src = std::fs::read_to_string(path).unwrap();
    let start = src.find("pub trait Backend:").expect("the Backend trait");
    let body_start = start + src[start..].find('{').unwrap();
    let mut depth = 0;
    let mut end = body_start;
    for (i, ch) in src[body_start..].char_indices() {
        match ch {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    end = body_start + i;
                    break;
                }
            }
            _ => {}
        }
    }
    let body = &src[body_start..end];
    body.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//"))
        .filter_map(|l| l.strip_prefix("fn "))
        .map(|l| l.split(['(', '<']).next().unwrap().trim().to_string())
        .collect()
}

fn variants() -> Vec<String> {
    let mut v: Vec<String> = UnaryOp::ALL.iter().map(|op| format!("unary:{}", op.name())).collect();
    v.extend(BinaryOp::ALL.iter().map(|op| format!("binary:{}", op.name())));
    v.extend(CmpOp::ALL.iter().map(|op| format!("compare:{}", op.name())));
    v.extend(ReduceKind::ALL.iter().map(|op| format!("reduce:{}", op.name())));
    v
}

#[test]
fn the_trait_parser_finds_the_methods() {
    let methods = backend_methods();
    assert!(methods.len() >= 25, "{methods:?}");
    for m in ["info", "matmul", "unary", "adam_step", "copy_strided"] {
        assert!(methods.iter().any(|x| x == m), "{m} not found in {methods:?}");
    }
}

#[test]
fn every_backend_op_has_a_case() {
    let covered = conformance::covered_ops();
    let missing: Vec<String> = backend_methods()
        .into_iter()
        .filter(|m| !NON_OP_METHODS.contains(&m.as_str()) && !covered.contains(m))
        .collect();
    assert!(
        missing.is_empty(),
        "Backend methods without a conformance case: {missing:?}"
    );
}

#[test]
fn every_op_variant_has_a_case() {
    let covered = conformance::covered_ops();
    let missing: Vec<String> = variants().into_iter().filter(|v| !covered.contains(v)).collect();
    assert!(
        missing.is_empty(),
        "op variants without a conformance case: {missing:?}"
    );
}

#[test]
fn every_named_op_exists() {
    let methods: BTreeSet<String> = backend_methods().into_iter().collect();
    let variants: BTreeSet<String> = variants().into_iter().collect();
    for case in conformance::all_cases() {
        assert!(!case.ops.is_empty(), "case {} names no op", case.name);
        for op in &case.ops {
            let known = if op.contains(':') {
                variants.contains(op)
            } else {
                methods.contains(op) && !NON_OP_METHODS.contains(&op.as_str())
            };
            assert!(
                known,
                "case {} names `{op}`, which is not a Backend method or op variant",
                case.name
            );
        }
        // A case is named after its first op, so searching for an op name finds its cases.
        assert!(
            case.name.starts_with(case.ops[0].as_str()),
            "case {} should start with its first op {}",
            case.name,
            case.ops[0]
        );
    }
}
