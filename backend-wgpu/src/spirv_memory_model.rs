//! Makes a SPIR-V module's workgroup-memory accesses non-private, as the Vulkan memory model
//! needs them to be for one invocation to see another's writes across a barrier.
//!
//! Why: naga declares the Vulkan memory model for every module with cooperative matrices (the
//! GLSL450 model elsewhere) but writes its loads and stores as before, without memory operands.
//! Under the Vulkan model such accesses are private: a barrier orders them for no other
//! invocation, and a driver may move them across it. glslang marks the same accesses
//! `NonPrivatePointer` with `MakePointerAvailable` (stores) or `MakePointerVisible` (loads) at
//! workgroup scope; this pass adds exactly those operands to every `OpLoad`, `OpStore`,
//! `OpCooperativeMatrixLoadKHR` and `OpCooperativeMatrixStoreKHR` through a pointer into
//! workgroup memory, and leaves every other word as it was.

use std::collections::HashSet;

const HEADER_WORDS: usize = 5;
/// The header word holding the id bound (one past the largest id).
const BOUND: usize = 3;

const OP_TYPE_INT: u32 = 21;
const OP_TYPE_POINTER: u32 = 32;
const OP_CONSTANT: u32 = 43;
const OP_FUNCTION: u32 = 54;
const OP_FUNCTION_PARAMETER: u32 = 55;
const OP_VARIABLE: u32 = 59;
const OP_LOAD: u32 = 61;
const OP_STORE: u32 = 62;
const OP_ACCESS_CHAIN: u32 = 65;
const OP_IN_BOUNDS_ACCESS_CHAIN: u32 = 66;
const OP_PTR_ACCESS_CHAIN: u32 = 67;
const OP_IN_BOUNDS_PTR_ACCESS_CHAIN: u32 = 70;
const OP_COPY_OBJECT: u32 = 83;
const OP_COOPERATIVE_MATRIX_LOAD: u32 = 4457;
const OP_COOPERATIVE_MATRIX_STORE: u32 = 4458;

const STORAGE_CLASS_WORKGROUP: u32 = 4;
const SCOPE_WORKGROUP: u32 = 2;

// Memory operands, in the order their extra operands follow the mask.
const VOLATILE: u32 = 0x1;
const ALIGNED: u32 = 0x2;
const NONTEMPORAL: u32 = 0x4;
const MAKE_POINTER_AVAILABLE: u32 = 0x8;
const MAKE_POINTER_VISIBLE: u32 = 0x10;
const NON_PRIVATE_POINTER: u32 = 0x20;

/// One instruction: its opcode and its words after the first.
struct Instruction<'a> {
    opcode: u32,
    operands: &'a [u32],
}

fn instructions(body: &[u32]) -> Result<Vec<Instruction<'_>>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < body.len() {
        let count = (body[at] >> 16) as usize;
        if count == 0 || at + count > body.len() {
            return Err(format!(
                "a SPIR-V instruction at word {} runs past the module",
                at + HEADER_WORDS
            ));
        }
        out.push(Instruction {
            opcode: body[at] & 0xffff,
            operands: &body[at + 1..at + count],
        });
        at += count;
    }
    Ok(out)
}

fn push(out: &mut Vec<u32>, opcode: u32, operands: &[u32]) {
    out.push(((operands.len() as u32 + 1) << 16) | opcode);
    out.extend_from_slice(operands);
}

/// Where an access's pointer sits among its operands, and how many operands come before its
/// memory operands; None for an instruction that is not one of the four accesses.
fn access_shape(instruction: &Instruction) -> Option<(usize, usize, u32)> {
    // (pointer index, fixed operands, the bits this access needs)
    let load = MAKE_POINTER_VISIBLE | NON_PRIVATE_POINTER;
    let store = MAKE_POINTER_AVAILABLE | NON_PRIVATE_POINTER;
    match instruction.opcode {
        // result type, result, pointer
        OP_LOAD => Some((2, 3, load)),
        // pointer, object
        OP_STORE => Some((0, 2, store)),
        // result type, result, pointer, layout, stride (naga always writes the stride)
        OP_COOPERATIVE_MATRIX_LOAD => Some((2, 5, load)),
        // pointer, object, layout, stride
        OP_COOPERATIVE_MATRIX_STORE => Some((0, 4, store)),
        _ => None,
    }
}

/// `operands` (memory operands: a mask then its extra operands) with `bits` added at `scope`.
fn with_memory_operands(existing: &[u32], bits: u32, scope: u32) -> Result<Vec<u32>, String> {
    let (mask, rest) = existing.split_first().map_or((0, &[][..]), |(m, r)| (*m, r));
    if mask & !(VOLATILE | ALIGNED | NONTEMPORAL) != 0 {
        return Err(format!("memory operands {mask:#x} already carry a memory-model bit"));
    }
    let alignment = if mask & ALIGNED != 0 {
        Some(*rest.first().ok_or("an Aligned memory operand without its alignment")?)
    } else {
        None
    };
    let mut out = vec![mask | bits];
    out.extend(alignment);
    if bits & MAKE_POINTER_AVAILABLE != 0 {
        out.push(scope);
    }
    if bits & MAKE_POINTER_VISIBLE != 0 {
        out.push(scope);
    }
    Ok(out)
}

/// `module` (SPIR-V words) with every access through a workgroup pointer made non-private, and
/// how many accesses were changed.
pub fn workgroup_accesses_non_private(module: &[u32]) -> Result<(Vec<u32>, usize), String> {
    if module.len() < HEADER_WORDS || module[0] != 0x0723_0203 {
        return Err("not a SPIR-V module (no magic number)".into());
    }
    let body = instructions(&module[HEADER_WORDS..])?;

    // The pointer types into workgroup memory, then every value of such a type.
    let pointer_types: HashSet<u32> = body
        .iter()
        .filter(|i| i.opcode == OP_TYPE_POINTER && i.operands.get(1) == Some(&STORAGE_CLASS_WORKGROUP))
        .map(|i| i.operands[0])
        .collect();
    let makes_pointer = |op: u32| {
        matches!(
            op,
            OP_VARIABLE
                | OP_FUNCTION_PARAMETER
                | OP_ACCESS_CHAIN
                | OP_IN_BOUNDS_ACCESS_CHAIN
                | OP_PTR_ACCESS_CHAIN
                | OP_IN_BOUNDS_PTR_ACCESS_CHAIN
                | OP_COPY_OBJECT
        )
    };
    let pointers: HashSet<u32> = body
        .iter()
        .filter(|i| makes_pointer(i.opcode) && i.operands.len() >= 2 && pointer_types.contains(&i.operands[0]))
        .map(|i| i.operands[1])
        .collect();

    // The scope operand is an id: a 32-bit unsigned constant 2, declared if the module has none.
    let uint = body
        .iter()
        .find(|i| i.opcode == OP_TYPE_INT && i.operands.get(1..3) == Some(&[32, 0]))
        .map(|i| i.operands[0]);
    let existing_scope = uint.and_then(|uint| {
        body.iter()
            .find(|i| i.opcode == OP_CONSTANT && matches!(i.operands, &[t, _, SCOPE_WORKGROUP] if t == uint))
            .map(|i| i.operands[1])
    });
    let mut bound = module[BOUND];
    let mut fresh_id = || {
        bound += 1;
        bound - 1
    };
    let (uint, declare_uint) = match uint {
        Some(id) => (id, false),
        None => (fresh_id(), true),
    };
    let (scope, declare_scope) = match existing_scope {
        Some(id) => (id, false),
        None => (fresh_id(), true),
    };

    let mut out = module[..HEADER_WORDS].to_vec();
    let mut changed = 0;
    let mut declared = false;
    for instruction in &body {
        if instruction.opcode == OP_FUNCTION && !declared {
            // Types and constants go before the first function.
            if declare_uint {
                push(&mut out, OP_TYPE_INT, &[uint, 32, 0]);
            }
            if declare_scope {
                push(&mut out, OP_CONSTANT, &[uint, scope, SCOPE_WORKGROUP]);
            }
            declared = true;
        }
        match access_shape(instruction) {
            Some((pointer, fixed, bits))
                if instruction.operands.len() >= fixed && pointers.contains(&instruction.operands[pointer]) =>
            {
                let (head, memory) = instruction.operands.split_at(fixed);
                let mut operands = head.to_vec();
                operands.extend(with_memory_operands(memory, bits, scope)?);
                push(&mut out, instruction.opcode, &operands);
                changed += 1;
            }
            _ => push(&mut out, instruction.opcode, instruction.operands),
        }
    }
    if !declared && (declare_uint || declare_scope) {
        return Err("a SPIR-V module without functions".into());
    }
    out[BOUND] = bound;
    Ok((out, changed))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAGIC_HEADER: [u32; 5] = [0x0723_0203, 0x0001_0300, 0, 100, 0];

    fn module(body: &[&[u32]]) -> Vec<u32> {
        let mut words = MAGIC_HEADER.to_vec();
        for i in body {
            push(&mut words, i[0], &i[1..]);
        }
        words
    }

    /// %1 uint, %2 = 2, %3 ptr<Workgroup, uint>, %4 ptr<StorageBuffer, uint>, %5 a workgroup
    /// variable, %6 a storage one, then a function's first instruction.
    const DECLARATIONS: [&[u32]; 7] = [
        &[OP_TYPE_INT, 1, 32, 0],
        &[OP_CONSTANT, 1, 2, 2],
        &[OP_TYPE_POINTER, 3, STORAGE_CLASS_WORKGROUP, 1],
        &[OP_TYPE_POINTER, 4, 12, 1],
        &[OP_VARIABLE, 3, 5, STORAGE_CLASS_WORKGROUP],
        &[OP_VARIABLE, 4, 6, 12],
        &[OP_FUNCTION, 7, 8, 0, 9],
    ];

    #[test]
    fn workgroup_accesses_gain_the_operands_and_the_rest_stays() {
        // Load wg, load sb, store sb, an access chain into wg, store through it (aligned), a
        // cooperative load through it, a cooperative store to sb.
        let accesses: [&[u32]; 7] = [
            &[OP_LOAD, 1, 10, 5],
            &[OP_LOAD, 1, 11, 6],
            &[OP_STORE, 6, 10],
            &[OP_ACCESS_CHAIN, 3, 12, 5, 2],
            &[OP_STORE, 12, 11, ALIGNED, 4],
            &[OP_COOPERATIVE_MATRIX_LOAD, 20, 13, 12, 0, 2],
            &[OP_COOPERATIVE_MATRIX_STORE, 6, 13, 0, 2],
        ];
        let (visible, available) = (
            MAKE_POINTER_VISIBLE | NON_PRIVATE_POINTER,
            MAKE_POINTER_AVAILABLE | NON_PRIVATE_POINTER,
        );
        let changed_accesses: [&[u32]; 7] = [
            &[OP_LOAD, 1, 10, 5, visible, 2],
            accesses[1],
            accesses[2],
            accesses[3],
            &[OP_STORE, 12, 11, ALIGNED | available, 4, 2],
            &[OP_COOPERATIVE_MATRIX_LOAD, 20, 13, 12, 0, 2, visible, 2],
            accesses[6],
        ];
        let input = module(&[&DECLARATIONS[..], &accesses[..]].concat());
        let (output, changed) = workgroup_accesses_non_private(&input).unwrap();
        assert_eq!(changed, 3);
        assert_eq!(output, module(&[&DECLARATIONS[..], &changed_accesses[..]].concat()));
    }

    #[test]
    fn a_missing_scope_constant_is_declared_before_the_first_function() {
        let input = module(&[
            &[OP_TYPE_POINTER, 3, STORAGE_CLASS_WORKGROUP, 9],
            &[OP_VARIABLE, 3, 5, STORAGE_CLASS_WORKGROUP],
            &[OP_FUNCTION, 7, 8, 0, 9],
            &[OP_STORE, 5, 10],
        ]);
        let (output, changed) = workgroup_accesses_non_private(&input).unwrap();
        assert_eq!(changed, 1);
        // Ids 100 (uint) and 101 (the constant 2); the bound moves past them.
        let mut expected = module(&[
            &[OP_TYPE_POINTER, 3, STORAGE_CLASS_WORKGROUP, 9],
            &[OP_VARIABLE, 3, 5, STORAGE_CLASS_WORKGROUP],
            &[OP_TYPE_INT, 100, 32, 0],
            &[OP_CONSTANT, 100, 101, SCOPE_WORKGROUP],
            &[OP_FUNCTION, 7, 8, 0, 9],
            &[OP_STORE, 5, 10, MAKE_POINTER_AVAILABLE | NON_PRIVATE_POINTER, 101],
        ]);
        expected[BOUND] = 102;
        assert_eq!(output, expected);
    }

    #[test]
    fn broken_input_is_an_error() {
        assert!(workgroup_accesses_non_private(&[1, 2, 3]).is_err());
        let mut truncated = module(&[&[OP_TYPE_INT, 1, 32, 0]]);
        truncated.pop();
        assert!(workgroup_accesses_non_private(&truncated).is_err());
        let already = module(&[
            &[OP_TYPE_POINTER, 3, STORAGE_CLASS_WORKGROUP, 9],
            &[OP_VARIABLE, 3, 5, STORAGE_CLASS_WORKGROUP],
            &[OP_FUNCTION, 7, 8, 0, 9],
            &[OP_STORE, 5, 10, NON_PRIVATE_POINTER],
        ]);
        assert!(workgroup_accesses_non_private(&already).is_err());
    }
}
