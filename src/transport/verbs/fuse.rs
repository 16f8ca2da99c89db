//! NIC fusion as pure logic: which member lists `makeVDevice` accepts, what a fused device
//! reports, and which member each queue pair of a fused connection runs on. A fused (virtual)
//! device is several RDMA ports NCCL treats as one NIC: a comm on it has queue pairs on every
//! member and stripes large messages across them (the protocol engine already splits a message
//! across queue pairs; here queue pair `q` of `n` is on member `q % members`).

/// Most members of one fused device (ncclNet v12's `NCCL_NET_MAX_DEVS_PER_NIC`; v9-v11 allow 4):
/// the wire formats' bound.
pub use crate::proto::verbs::MAX_MEMBERS;
/// Most fused devices a process makes (as net_ib: 256).
pub const MAX_VDEVS: usize = 256;
/// NCCL_NET_ID_UNDEF: no rail or plane.
pub const ID_UNDEF: i16 = -1;
/// The bit net_ib sets in a fused device's plane id, above one bit per member's plane.
pub const PLANE_VIRT_BIT: i16 = 1 << 14;

/// What `makeVDevice` needs to know of each physical device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    pub name: String,
    /// Only RDMA ports fuse (not TCP interfaces).
    pub rdma: bool,
    /// IBV_LINK_LAYER_*.
    pub link_layer: u8,
    pub speed: i32,
    pub rail: i16,
    /// Index of the device's plane among the distinct planes of NCCL_IB_HCA (0: none).
    pub plane_idx: u8,
    pub plane: i16,
}

/// Why a member list cannot be fused: the text of an `ncclInvalidUsage`, saying what to change.
pub fn check(devs: &[i32], phys: &[MemberInfo], merge_nics: bool, made: usize) -> Result<(), String> {
    if devs.is_empty() {
        return Err("makeVDevice with no devices: a virtual NIC needs at least one member".into());
    }
    if devs.len() > 1 && !merge_nics {
        return Err(format!("makeVDevice of {} devices refused: NCCL_IB_MERGE_NICS=0 disables NIC fusion", devs.len()));
    }
    if devs.len() > MAX_MEMBERS {
        return Err(format!("makeVDevice of {} devices: a virtual NIC has at most {MAX_MEMBERS} members", devs.len()));
    }
    if made >= MAX_VDEVS {
        return Err(format!("makeVDevice: {MAX_VDEVS} virtual NICs made already, no more can be"));
    }
    for (i, &d) in devs.iter().enumerate() {
        let Some(m) = usize::try_from(d).ok().and_then(|d| phys.get(d)) else {
            return Err(format!(
                "makeVDevice: member {d} is not a physical device (this host has {}: 0..{}); a virtual NIC fuses physical devices only",
                phys.len(),
                phys.len().saturating_sub(1)
            ));
        };
        if devs[..i].contains(&d) {
            return Err(format!("makeVDevice: device {d} ({}) is listed twice", m.name));
        }
        if !m.rdma && devs.len() > 1 {
            return Err(format!("makeVDevice: device {d} ({}) is a TCP interface; only RDMA ports fuse", m.name));
        }
        let first = &phys[devs[0] as usize];
        if m.link_layer != first.link_layer {
            return Err(format!(
                "makeVDevice: {} is {} but {} is {}: a virtual NIC's members share one link layer (select ports of one kind with NCCL_IB_HCA)",
                first.name,
                ll_name(first.link_layer),
                m.name,
                ll_name(m.link_layer)
            ));
        }
    }
    Ok(())
}

fn ll_name(ll: u8) -> &'static str {
    if ll == crate::sys::ib::IBV_LINK_LAYER_ETHERNET as u8 {
        "RoCE"
    } else {
        "InfiniBand"
    }
}

/// What a fused device reports besides its first member's properties: the members' names joined
/// by '+', the sum of their speeds, the rail when every member has the same one (else none), and
/// the plane as net_ib makes it (PLANE_VIRT_BIT and one bit per member's plane index; one
/// member: its own plane).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fused {
    pub name: String,
    pub speed: i32,
    pub rail: i16,
    pub plane: i16,
}

pub fn fused(members: &[&MemberInfo]) -> Fused {
    let name = members.iter().map(|m| m.name.as_str()).collect::<Vec<_>>().join("+");
    let speed = members.iter().fold(0i32, |s, m| s.saturating_add(m.speed));
    let rail = members[0].rail;
    let rail = if rail != ID_UNDEF && members.iter().all(|m| m.rail == rail) { rail } else { ID_UNDEF };
    let plane = if members.len() == 1 {
        members[0].plane
    } else {
        members.iter().fold(PLANE_VIRT_BIT, |p, m| p | (1i16 << m.plane_idx.min(13)))
    };
    Fused { name, speed, rail, plane }
}

/// The member of a connection's side with `members` members that queue pair `q` runs on.
pub fn member_of(q: usize, members: usize) -> usize {
    q % members.max(1)
}

/// The queue pairs (bit q) of a connection of `nqps` between a sender of `ls` members and a
/// receiver of `lr` that run on a member down at setup (`s_down`, `r_down`: bit m, member m of
/// that side). Both sides compute it from the two masks their metadata carried, so both start
/// with the same queue pairs failed over.
pub fn born_down(nqps: usize, ls: usize, s_down: u8, lr: usize, r_down: u8) -> u32 {
    (0..nqps.min(32))
        .filter(|&q| s_down & (1 << member_of(q, ls)) != 0 || r_down & (1 << member_of(q, lr)) != 0)
        .fold(0, |m, q| m | 1 << q)
}

/// Queue pairs of a connection between a side of `local` members and one of `remote`: every
/// member of the larger side carries `per_member` (NCCL_IB_QPS_PER_CONNECTION), as net_ib;
/// at most `max`.
pub fn nqps(local: usize, remote: usize, per_member: usize, max: usize) -> usize {
    (local.max(remote).max(1) * per_member.max(1)).min(max)
}

/// NCCL_IB_WARN_RAIL_LOCAL's test, as net_ib makes it on the accepting side: the two sides'
/// devices (each host's own device indices of their members) do not all match.
pub fn rails_differ(local: &[u8], remote: &[u8]) -> bool {
    let common = local.iter().filter(|d| remote.contains(d)).count();
    common < local.len().max(remote.len())
}

/// Device indices as the rail-local message prints them: "0,2".
pub fn join(v: &[u8]) -> String {
    v.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::ib::{IBV_LINK_LAYER_ETHERNET, IBV_LINK_LAYER_INFINIBAND};

    fn dev(name: &str, ll: u32, speed: i32, rail: i16, plane: i16, plane_idx: u8) -> MemberInfo {
        MemberInfo { name: name.into(), rdma: true, link_layer: ll as u8, speed, rail, plane, plane_idx }
    }

    fn four() -> Vec<MemberInfo> {
        vec![
            dev("mlx5_0", IBV_LINK_LAYER_INFINIBAND, 200_000, 0, ID_UNDEF, 0),
            dev("mlx5_1", IBV_LINK_LAYER_INFINIBAND, 200_000, 0, ID_UNDEF, 0),
            dev("mlx5_2", IBV_LINK_LAYER_ETHERNET, 100_000, 1, ID_UNDEF, 0),
            MemberInfo { rdma: false, ..dev("eth0", IBV_LINK_LAYER_ETHERNET, 25_000, ID_UNDEF, ID_UNDEF, 0) },
        ]
    }

    #[test]
    fn member_lists_are_checked_with_reasons() {
        let p = four();
        assert_eq!(check(&[0, 1], &p, true, 0), Ok(()));
        assert_eq!(check(&[1], &p, false, 0), Ok(()), "one member needs no fusion");
        assert_eq!(check(&[3], &p, true, 0), Ok(()), "one member may be a TCP interface");
        let e = |devs: &[i32], merge: bool, made: usize| check(devs, &p, merge, made).unwrap_err();
        assert!(e(&[], true, 0).contains("no devices"));
        assert!(e(&[0, 1], false, 0).contains("NCCL_IB_MERGE_NICS=0"));
        assert!(e(&[0, 1, 0, 1, 0, 1, 0, 1, 0], true, 0).contains("at most 8"));
        assert!(e(&[0, 1], true, MAX_VDEVS).contains("no more"));
        assert!(e(&[0, 7], true, 0).contains("member 7 is not a physical device"));
        assert!(e(&[-1, 0], true, 0).contains("member -1"));
        assert!(e(&[0, 0], true, 0).contains("listed twice"));
        assert!(e(&[0, 3], true, 0).contains("TCP interface"));
        let ll = e(&[0, 2], true, 0);
        assert!(ll.contains("mlx5_0 is InfiniBand but mlx5_2 is RoCE") && ll.contains("NCCL_IB_HCA"), "{ll}");
    }

    #[test]
    fn a_fused_device_sums_speeds_joins_names_and_merges_rails_and_planes() {
        let p = four();
        let f = fused(&[&p[0], &p[1]]);
        assert_eq!(f, Fused { name: "mlx5_0+mlx5_1".into(), speed: 400_000, rail: 0, plane: PLANE_VIRT_BIT | 1 });
        // Rails that differ (or one undefined) give none.
        assert_eq!(fused(&[&p[0], &p[2]]).rail, ID_UNDEF);
        let a = dev("a", IBV_LINK_LAYER_INFINIBAND, 1, ID_UNDEF, 3, 1);
        let b = dev("b", IBV_LINK_LAYER_INFINIBAND, 1, ID_UNDEF, 5, 2);
        assert_eq!(fused(&[&a]).plane, 3, "one member keeps its own plane");
        assert_eq!(fused(&[&a, &b]).plane, PLANE_VIRT_BIT | 0b110);
        assert_eq!(fused(&[&a, &b]).rail, ID_UNDEF);
    }

    #[test]
    fn queue_pairs_cover_every_member_of_the_larger_side() {
        assert_eq!(nqps(2, 2, 1, 16), 2);
        assert_eq!(nqps(1, 2, 1, 16), 2, "the receiver's second member gets a queue pair");
        assert_eq!(nqps(2, 1, 2, 16), 4);
        assert_eq!(nqps(8, 8, 4, 16), 16, "capped");
        assert_eq!(nqps(1, 1, 1, 16), 1);
        assert_eq!((0..4).map(|q| member_of(q, 2)).collect::<Vec<_>>(), [0, 1, 0, 1]);
        assert_eq!((0..4).map(|q| member_of(q, 1)).collect::<Vec<_>>(), [0, 0, 0, 0]);
    }

    #[test]
    fn queue_pairs_on_a_member_down_at_setup() {
        assert_eq!(born_down(4, 2, 0, 2, 0), 0);
        assert_eq!(born_down(4, 2, 0b10, 2, 0), 0b1010, "the sender's member 1: queue pairs 1 and 3");
        assert_eq!(born_down(4, 2, 0, 1, 0b1), 0b1111, "the receiver's only member: all");
        assert_eq!(born_down(3, 2, 0b01, 1, 0), 0b101, "uneven: queue pairs 0 and 2 on member 0");
        assert_eq!(born_down(4, 2, 0b01, 2, 0b10), 0b1111, "one member down on each side, crosswise");
        assert_eq!(born_down(2, 1, 0, 2, 0b10), 0b10);
    }

    #[test]
    fn rail_local_compares_the_members_device_indices() {
        assert!(!rails_differ(&[0], &[0]));
        assert!(!rails_differ(&[0, 2], &[2, 0]));
        assert!(rails_differ(&[0], &[1]));
        assert!(rails_differ(&[0, 2], &[0]), "a member more on one side");
        assert!(rails_differ(&[0, 2], &[1, 3]));
    }
}
