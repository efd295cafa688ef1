//! A cheap structural check of a CUBIN read back from the disk cache: a truncated, zero-filled
//! or foreign file must be recompiled, not handed to the driver (which would fail to load it,
//! or worse, load half a module).

/// `e_machine` of a CUDA ELF object.
const EM_CUDA: u16 = 190;
/// `sh_type` of a section that takes no room in the file (`.nv.shared.*`).
const SHT_NOBITS: u32 = 8;
/// Size of an ELF64 file header.
const ELF64_HEADER: usize = 64;

/// Whether `bytes` look like a whole CUBIN: a little-endian ELF64 CUDA object whose program and
/// section header tables, and every section they list, lie inside the file.
pub(crate) fn is_plausible_cubin(bytes: &[u8]) -> bool {
    has_cuda_elf_header(bytes) && headers_fit(bytes) && sections_fit(bytes)
}

fn has_cuda_elf_header(bytes: &[u8]) -> bool {
    bytes.len() >= ELF64_HEADER
        && bytes.starts_with(b"\x7fELF")
        && bytes[4] == 2 // ELFCLASS64
        && bytes[5] == 1 // little-endian
        && u16_at(bytes, 18) == Some(EM_CUDA)
}

/// The program header table (the last thing NVRTC writes) and the section header table.
fn headers_fit(bytes: &[u8]) -> bool {
    let program_headers = table(bytes, 32, 54, 56);
    let section_headers = table(bytes, 40, 58, 60);
    [program_headers, section_headers]
        .iter()
        .all(|t| t.is_some_and(|(offset, size, count)| fits(bytes, offset, size.checked_mul(count))))
}

fn sections_fit(bytes: &[u8]) -> bool {
    let Some((table_offset, entry_size, count)) = table(bytes, 40, 58, 60) else {
        return false;
    };
    (0..count).all(|i| {
        let Some(header) = i.checked_mul(entry_size).and_then(|o| o.checked_add(table_offset)) else {
            return false;
        };
        let kind = u32_at(bytes, header + 4);
        let offset = u64_at(bytes, header + 24);
        let size = u64_at(bytes, header + 32);
        match (kind, offset, size) {
            (Some(SHT_NOBITS), Some(_), Some(_)) => true,
            (Some(_), Some(offset), Some(size)) => fits(bytes, offset, Some(size)),
            _ => false,
        }
    })
}

/// (offset, entry size, entry count) of the header table described at the given header fields.
fn table(bytes: &[u8], offset_at: usize, entry_size_at: usize, count_at: usize) -> Option<(u64, u64, u64)> {
    Some((
        u64_at(bytes, offset_at)?,
        u64::from(u16_at(bytes, entry_size_at)?),
        u64::from(u16_at(bytes, count_at)?),
    ))
}

fn fits(bytes: &[u8], offset: u64, size: Option<u64>) -> bool {
    size.and_then(|s| offset.checked_add(s))
        .is_some_and(|end| end <= bytes.len() as u64)
}

fn u16_at(bytes: &[u8], at: impl TryInto<usize>) -> Option<u16> {
    Some(u16::from_le_bytes(field(bytes, at)?))
}

fn u32_at(bytes: &[u8], at: impl TryInto<usize>) -> Option<u32> {
    Some(u32::from_le_bytes(field(bytes, at)?))
}

fn u64_at(bytes: &[u8], at: impl TryInto<usize>) -> Option<u64> {
    Some(u64::from_le_bytes(field(bytes, at)?))
}

fn field<const N: usize>(bytes: &[u8], at: impl TryInto<usize>) -> Option<[u8; N]> {
    let at: usize = at.try_into().ok()?;
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

/// A minimal whole CUBIN layout: a header, one 16-byte section and the two header tables (not
/// loadable code; enough for the checks above).
#[cfg(test)]
pub(crate) fn tiny_cubin() -> Vec<u8> {
    let mut bytes = vec![0u8; 64 + 16 + 64 * 2 + 56];
    bytes[..4].copy_from_slice(b"\x7fELF");
    bytes[4] = 2;
    bytes[5] = 1;
    bytes[18..20].copy_from_slice(&EM_CUDA.to_le_bytes());
    // Section headers at 80: a NULL entry and one PROGBITS section at 64, 16 bytes long.
    bytes[40..48].copy_from_slice(&80u64.to_le_bytes());
    bytes[58..60].copy_from_slice(&64u16.to_le_bytes());
    bytes[60..62].copy_from_slice(&2u16.to_le_bytes());
    let section = 80 + 64;
    bytes[section + 4..section + 8].copy_from_slice(&1u32.to_le_bytes());
    bytes[section + 24..section + 32].copy_from_slice(&64u64.to_le_bytes());
    bytes[section + 32..section + 40].copy_from_slice(&16u64.to_le_bytes());
    // One program header at the very end, as NVRTC lays it out.
    bytes[32..40].copy_from_slice(&(208u64).to_le_bytes());
    bytes[54..56].copy_from_slice(&56u16.to_le_bytes());
    bytes[56..58].copy_from_slice(&1u16.to_le_bytes());
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_cubin_passes() {
        assert!(is_plausible_cubin(&tiny_cubin()));
    }

    #[test]
    fn garbage_zeros_and_empty_files_fail() {
        assert!(!is_plausible_cubin(b""));
        assert!(!is_plausible_cubin(&[0u8; 4096]));
        assert!(!is_plausible_cubin(
            b"not a cubin at all, just some text that is long enough to pass a length check"
        ));
    }

    #[test]
    fn a_truncated_cubin_fails_at_every_length() {
        let whole = tiny_cubin();
        for len in 0..whole.len() {
            assert!(
                !is_plausible_cubin(&whole[..len]),
                "accepted {len} of {} bytes",
                whole.len()
            );
        }
    }

    #[test]
    fn a_section_beyond_the_end_fails() {
        let mut bytes = tiny_cubin();
        let size_field = 80 + 64 + 32;
        bytes[size_field..size_field + 8].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(!is_plausible_cubin(&bytes));
    }

    #[test]
    fn a_host_elf_fails() {
        let mut bytes = tiny_cubin();
        bytes[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
        assert!(!is_plausible_cubin(&bytes));
    }
}
