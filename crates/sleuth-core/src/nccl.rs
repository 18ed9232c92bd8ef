//! NCCL calls: where each argument of NCCL 2.28's exported functions lives
//! (a register or the caller's stack), the decoded event, and names of
//! datatypes and reduction ops.
//!
//! x86-64 System V: the first six integer arguments are in registers, the
//! rest on the stack just above the return address. `ncclUniqueId` (128 bytes)
//! is passed by value *on the stack* and takes no register, so in
//! `ncclCommInitRank(comm*, nranks, commId, rank)` the rank is the third
//! register argument and the id's first bytes are the first stack words.

pub mod align;
pub mod comms;
pub mod stragglers;

use crate::event::CallEvent;
use crate::ops::OpClass;
use serde::Serialize;

/// Where one argument is found at function entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// 0-based integer argument register.
    Reg(u8),
    /// 0-based 8-byte word of the caller's stack above the return address.
    Stack(u8),
}

/// Which arguments of an NCCL op gpusleuth decodes.
#[derive(Debug, Clone, Copy, Default)]
pub struct NcclArgs {
    /// The communicator the call uses.
    pub comm: Option<Slot>,
    pub count: Option<Slot>,
    pub datatype: Option<Slot>,
    pub redop: Option<Slot>,
    /// Root (broadcast, reduce) or peer (send, recv).
    pub peer: Option<Slot>,
    pub stream: Option<Slot>,
    pub rank: Option<Slot>,
    pub nranks: Option<Slot>,
    /// `ncclCommSplit`'s color.
    pub color: Option<Slot>,
    /// The `ncclUniqueId` starts at stack word 0 (init by rank).
    pub unique_id: bool,
}

use Slot::{Reg, Stack};

/// The argument layout of an NCCL op (by name; None for non-NCCL ops).
pub fn args_of(name: &str) -> Option<NcclArgs> {
    let none = NcclArgs::default();
    let a = match name {
        // (ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank[, ncclConfig_t* config])
        "ncclCommInitRank" | "ncclCommInitRankConfig" => NcclArgs {
            nranks: Some(Reg(1)),
            rank: Some(Reg(2)),
            unique_id: true,
            ..none
        },
        // (ncclComm_t* comms, int ndev, const int* devlist): one process, every rank.
        "ncclCommInitAll" => NcclArgs {
            nranks: Some(Reg(1)),
            ..none
        },
        // (ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config)
        "ncclCommSplit" => NcclArgs {
            comm: Some(Reg(0)),
            color: Some(Reg(1)),
            ..none
        },
        "ncclCommDestroy" | "ncclCommAbort" => NcclArgs {
            comm: Some(Reg(0)),
            ..none
        },
        // (sendbuff, recvbuff, count, datatype, op, comm, stream)
        "ncclAllReduce" | "ncclReduceScatter" => NcclArgs {
            count: Some(Reg(2)),
            datatype: Some(Reg(3)),
            redop: Some(Reg(4)),
            comm: Some(Reg(5)),
            stream: Some(Stack(0)),
            ..none
        },
        // (sendbuff, recvbuff, sendcount, datatype, comm, stream)
        "ncclAllGather" => NcclArgs {
            count: Some(Reg(2)),
            datatype: Some(Reg(3)),
            comm: Some(Reg(4)),
            stream: Some(Reg(5)),
            ..none
        },
        // (sendbuff, recvbuff, count, datatype, root, comm, stream)
        "ncclBroadcast" => NcclArgs {
            count: Some(Reg(2)),
            datatype: Some(Reg(3)),
            peer: Some(Reg(4)),
            comm: Some(Reg(5)),
            stream: Some(Stack(0)),
            ..none
        },
        // (sendbuff, recvbuff, count, datatype, op, root, comm, stream)
        "ncclReduce" => NcclArgs {
            count: Some(Reg(2)),
            datatype: Some(Reg(3)),
            redop: Some(Reg(4)),
            peer: Some(Reg(5)),
            comm: Some(Stack(0)),
            stream: Some(Stack(1)),
            ..none
        },
        // (buff, count, datatype, peer, comm, stream)
        "ncclSend" | "ncclRecv" => NcclArgs {
            count: Some(Reg(1)),
            datatype: Some(Reg(2)),
            peer: Some(Reg(3)),
            comm: Some(Reg(4)),
            stream: Some(Reg(5)),
            ..none
        },
        "ncclGroupStart" | "ncclGroupEnd" => none,
        _ => return None,
    };
    Some(a)
}

/// One completed NCCL call: the call itself (also stored with every other
/// call) and what its arguments say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct NcclEvent {
    pub call: CallEvent,
    /// The communicator used (collectives, point-to-point, destroy, split's parent).
    pub comm: Option<u64>,
    /// The communicator created (init, split), read through the out-pointer at return.
    pub new_comm: Option<u64>,
    /// Element count (per rank for all-gather sends / reduce-scatter receives).
    pub count: Option<u64>,
    pub datatype: Option<u32>,
    pub redop: Option<u32>,
    /// Root (broadcast, reduce) or peer (send, recv).
    pub peer: Option<u32>,
    /// Rank and communicator size given at init.
    pub rank: Option<u32>,
    pub nranks: Option<u32>,
    /// `ncclCommSplit`'s color.
    pub color: Option<i32>,
    /// Hex of the first 16 bytes of the `ncclUniqueId` (shared by every rank of the communicator).
    pub unique_id: Option<String>,
}

impl NcclEvent {
    pub fn class(&self) -> Option<OpClass> {
        self.call.info().map(|o| o.class)
    }
    pub fn is_collective(&self) -> bool {
        self.class() == Some(OpClass::Collective)
    }
}

/// Builds the event from a call's registers and stack words.
pub fn decode(mut call: CallEvent, args: &[u64; 6], stack: &[u64], out: Option<u64>) -> NcclEvent {
    let layout = call
        .info()
        .and_then(|o| args_of(o.name))
        .unwrap_or_default();
    let get = |s: Option<Slot>| -> Option<u64> {
        match s? {
            Slot::Reg(i) => args.get(i as usize).copied(),
            Slot::Stack(i) => stack.get(i as usize).copied(),
        }
    };
    let int = |s: Option<Slot>| get(s).map(|v| v as u32); // C int: low 32 bits
    let count = get(layout.count);
    let datatype = int(layout.datatype);
    let comm = get(layout.comm);
    let stream = get(layout.stream);
    if let (Some(n), Some(size)) = (count, datatype.and_then(datatype_size)) {
        call.size = Some(n.saturating_mul(size));
    }
    call.ptr = comm.or(out);
    call.stream = stream;
    let unique_id = (layout.unique_id && stack.len() >= 2).then(|| {
        stack[..2]
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    });
    NcclEvent {
        comm,
        new_comm: out,
        count,
        datatype,
        redop: int(layout.redop),
        peer: int(layout.peer),
        rank: int(layout.rank),
        nranks: int(layout.nranks),
        color: int(layout.color).map(|c| c as i32),
        unique_id,
        call,
    }
}

/// Bytes per element of an `ncclDataType_t` (NCCL 2.28 numbering).
pub fn datatype_size(dt: u32) -> Option<u64> {
    match dt {
        0 | 1 => Some(1),   // int8, uint8
        2 | 3 => Some(4),   // int32, uint32
        4 | 5 => Some(8),   // int64, uint64
        6 => Some(2),       // float16
        7 => Some(4),       // float32
        8 => Some(8),       // float64
        9 => Some(2),       // bfloat16
        10 | 11 => Some(1), // float8 e4m3, e5m2
        _ => None,
    }
}

/// Name of an `ncclDataType_t`.
pub fn datatype_name(dt: u32) -> &'static str {
    match dt {
        0 => "int8",
        1 => "uint8",
        2 => "int32",
        3 => "uint32",
        4 => "int64",
        5 => "uint64",
        6 => "float16",
        7 => "float32",
        8 => "float64",
        9 => "bfloat16",
        10 => "float8e4m3",
        11 => "float8e5m2",
        _ => "unknown",
    }
}

/// Name of an `ncclRedOp_t` (values from 5 on are user-defined ops).
pub fn redop_name(op: u32) -> &'static str {
    match op {
        0 => "sum",
        1 => "prod",
        2 => "max",
        3 => "min",
        4 => "avg",
        _ => "custom",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::{op_by_name, ops_of, Layer};

    #[test]
    fn every_nccl_op_has_a_layout() {
        for o in ops_of(Layer::Nccl) {
            assert!(args_of(o.name).is_some(), "{}", o.name);
        }
        assert!(args_of("cudaMalloc").is_none());
    }

    #[test]
    fn all_reduce_takes_its_stream_from_the_stack() {
        let op = op_by_name("ncclAllReduce").unwrap();
        let call = CallEvent {
            op: op.id,
            ..Default::default()
        };
        let e = decode(call, &[0x10, 0x20, 1000, 7, 0, 0xc0de], &[0x5eed, 0], None);
        assert_eq!(e.count, Some(1000));
        assert_eq!(e.datatype, Some(7));
        assert_eq!(e.redop, Some(0));
        assert_eq!(e.comm, Some(0xc0de));
        assert_eq!(e.call.stream, Some(0x5eed));
        assert_eq!(e.call.size, Some(4000), "1000 float32");
        assert_eq!(e.call.ptr, Some(0xc0de));
        assert!(e.is_collective());
    }

    #[test]
    fn reduce_takes_comm_and_stream_from_the_stack() {
        let op = op_by_name("ncclReduce").unwrap();
        let call = CallEvent {
            op: op.id,
            ..Default::default()
        };
        let e = decode(call, &[0, 0, 8, 9, 2, 1], &[0xc0, 0x5e], None);
        assert_eq!(
            (e.peer, e.comm, e.call.stream),
            (Some(1), Some(0xc0), Some(0x5e))
        );
        assert_eq!(e.call.size, Some(16), "8 bfloat16");
    }

    #[test]
    fn init_reads_rank_from_the_third_register_and_the_id_from_the_stack() {
        let op = op_by_name("ncclCommInitRank").unwrap();
        let call = CallEvent {
            op: op.id,
            ..Default::default()
        };
        let e = decode(
            call,
            &[0x7ff0, 4, 3, 0, 0, 0],
            &[0x0807060504030201, 0x100f0e0d0c0b0a09, 0, 0],
            Some(0xabc),
        );
        assert_eq!((e.rank, e.nranks), (Some(3), Some(4)));
        assert_eq!(e.new_comm, Some(0xabc));
        assert_eq!(
            e.unique_id.as_deref(),
            Some("0102030405060708090a0b0c0d0e0f10")
        );
    }
}
