//! One field offset from the kernel's BTF: `task_struct.thread.fsbase`.
//!
//! The call programs are also loaded by multi.rs, which applies no CO-RE
//! relocations, so the offset the kernel side needs to find a thread's fs
//! base (its `pthread_self()`, how CPython names a thread) is computed here
//! and passed as a read-only global.

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;

struct Type {
    name_off: u32,
    kind: u32,
    kind_flag: bool,
    /// (name_off, type id, offset in bits) for structs and unions.
    members: Vec<(u32, u32, u32)>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn parse(b: &[u8]) -> Option<(Vec<Type>, &[u8])> {
    if u16::from_le_bytes(b.get(0..2)?.try_into().ok()?) != BTF_MAGIC {
        return None;
    }
    let hdr_len = u32_at(b, 4)? as usize;
    let type_off = u32_at(b, 8)? as usize;
    let type_len = u32_at(b, 12)? as usize;
    let str_off = u32_at(b, 16)? as usize;
    let str_len = u32_at(b, 20)? as usize;
    let types = b.get(hdr_len + type_off..hdr_len + type_off + type_len)?;
    let strings = b.get(hdr_len + str_off..hdr_len + str_off + str_len)?;
    // Type ids start at 1: index 0 is a placeholder for "void".
    let mut out = vec![Type {
        name_off: 0,
        kind: 0,
        kind_flag: false,
        members: Vec::new(),
    }];
    let mut i = 0;
    while i + 12 <= types.len() {
        let name_off = u32_at(types, i)?;
        let info = u32_at(types, i + 4)?;
        let vlen = (info & 0xffff) as usize;
        let kind = (info >> 24) & 0x1f;
        let kind_flag = info >> 31 == 1;
        i += 12;
        let mut members = Vec::new();
        let extra = match kind {
            1 => 4,  // int
            3 => 12, // array
            KIND_STRUCT | KIND_UNION => {
                for m in 0..vlen {
                    let at = i + m * 12;
                    members.push((
                        u32_at(types, at)?,
                        u32_at(types, at + 4)?,
                        u32_at(types, at + 8)?,
                    ));
                }
                vlen * 12
            }
            6 => vlen * 8,   // enum
            13 => vlen * 8,  // func proto
            14 => 4,         // var
            15 => vlen * 12, // datasec
            17 => 4,         // decl tag
            19 => vlen * 12, // enum64
            _ => 0,          // ptr, fwd, typedef, modifiers, func, float, type tag
        };
        i += extra;
        out.push(Type {
            name_off,
            kind,
            kind_flag,
            members,
        });
    }
    Some((out, strings))
}

fn name(strings: &[u8], off: u32) -> &[u8] {
    let s = strings.get(off as usize..).unwrap_or(&[]);
    &s[..s.iter().position(|&c| c == 0).unwrap_or(s.len())]
}

/// Byte offset of `field` in the struct `ty`, and the field's type id.
fn member(types: &[Type], strings: &[u8], ty: usize, field: &str) -> Option<(u32, u32)> {
    let t = types.get(ty)?;
    t.members.iter().find_map(|&(n, tid, off)| {
        let bits = if t.kind_flag { off & 0x00ff_ffff } else { off };
        (name(strings, n) == field.as_bytes()).then_some((bits / 8, tid))
    })
}

/// `offsetof(struct task_struct, thread.fsbase)` from BTF bytes.
pub fn fsbase_offset_in(btf: &[u8]) -> Option<u32> {
    let (types, strings) = parse(btf)?;
    let task = types
        .iter()
        .position(|t| t.kind == KIND_STRUCT && name(strings, t.name_off) == b"task_struct")?;
    let (thread_off, thread_ty) = member(&types, strings, task, "thread")?;
    let (fs_off, _) = member(&types, strings, thread_ty as usize, "fsbase")?;
    Some(thread_off + fs_off)
}

/// The offset on the running kernel.
pub fn task_fsbase_offset() -> Result<u32, String> {
    let btf = std::fs::read("/sys/kernel/btf/vmlinux")
        .map_err(|e| format!("cannot read /sys/kernel/btf/vmlinux: {e}"))?;
    fsbase_offset_in(&btf)
        .ok_or_else(|| "task_struct.thread.fsbase not found in the kernel's BTF".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_fsbase_in_the_running_kernel() {
        let Ok(btf) = std::fs::read("/sys/kernel/btf/vmlinux") else {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("CI: /sys/kernel/btf/vmlinux must exist");
            }
            eprintln!("skipped: no kernel BTF on this machine");
            return;
        };
        let off = fsbase_offset_in(&btf).expect("fsbase offset");
        // thread_struct sits at the end of task_struct: kilobytes in.
        assert!(off > 1000 && off.is_multiple_of(8), "offset {off}");
        assert!(fsbase_offset_in(&btf[..100]).is_none());
    }
}
