//! IRD/ORD of an rdma_cm connection ([MS-SMBD] Appendix A): what we offer,
//! how the offer and the answer travel (the CM's own fields on InfiniBand
//! and RoCE, the 8-byte IRD/ORD negotiate header of 6.1 at the start of the
//! private data on iWARP), and what each side ends up with. Pure functions
//! of the offers and the private data, so every rule is tested without a
//! device; `connection_manager` only moves their results into
//! `rdma_conn_param` and the queue pair.
//!
//! # Which values each side takes
//!
//! Over the CM (InfiniBand, RoCE) both sides do what rdma_cm does: our IRD is
//! the smaller of what we offer and the peer's ORD, our ORD the smaller of
//! what we offer and the peer's IRD ([`negotiate_over_cm`]).
//!
//! With the header (iWARP), the accepting side computes the reply with
//! [MS-SMBD] 6.2 as written ([`negotiate_ird_ord`]): IRD = min(our ORD,
//! peer's IRD), ORD = min(our IRD, peer's ORD). Those are the *connecting*
//! peer's values (its IRD is bounded by the RDMA Reads we may issue, its ORD
//! by the ones we accept), and 6.2 has the connecting peer adopt them as
//! they are. The accepting provider takes the mirror image: ORD
//! (`initiator_depth`) = the reply's IRD, IRD (`responder_resources`) = the
//! reply's ORD. Taking the reply literally on this side as well would let us
//! issue min(our IRD, peer's ORD) RDMA Reads to a peer that accepts only
//! min(our ORD, peer's IRD). The mirror is also what the CM computes on
//! InfiniBand and RoCE (docs/spec-notes.md, "What the providers set IRD/ORD
//! to"), so both ends get the same values on every transport.
//!
//! Linux (ksmbd, cifs) writes the header big-endian, as we do
//! (docs/spec-notes.md, "IRD/ORD byte order").

use smbdirect_protocol::smbd::wire::{negotiate_ird_ord, IrdOrdError, IrdOrdHeader, IrdOrdRepr};

use super::device::Transport;
use crate::provider::QpCaps;

/// Bytes of the IRD/ORD negotiate header ([MS-SMBD] 6.1).
pub(super) const HEADER_LEN: usize = 8;

/// How a device's transport carries IRD/ORD at connection time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Carrier {
    /// In the CM's own `responder_resources`/`initiator_depth` (InfiniBand
    /// CM REQ/REP on InfiniBand and RoCE; also any other transport). No
    /// header in the private data.
    Cm,
    /// In the IRD/ORD negotiate header at the start of the private data
    /// ([MS-SMBD] Appendix A; iWARP, whose MPA may not negotiate them).
    PrivateDataHeader,
}

impl Carrier {
    /// The carrier for a device's transport.
    pub fn of(transport: Transport) -> Carrier {
        match transport {
            Transport::Iwarp => Carrier::PrivateDataHeader,
            Transport::InfiniBand | Transport::Other(_) => Carrier::Cm,
        }
    }

    /// Bytes the carrier puts before the caller's private data.
    pub fn header_len(self) -> usize {
        match self {
            Carrier::Cm => 0,
            Carrier::PrivateDataHeader => HEADER_LEN,
        }
    }
}

/// The IRD and ORD we offer: the caps, clamped to the device and to the
/// CM's 8-bit fields.
pub(super) fn offered_ird_ord(
    caps: &QpCaps,
    max_qp_rd_atom: u32,
    max_qp_init_rd_atom: u32,
) -> (u32, u32) {
    (
        caps.ird.min(max_qp_rd_atom).min(255),
        caps.ord.min(max_qp_init_rd_atom).min(255),
    )
}

/// Negotiation over the CM's fields (InfiniBand, RoCE; and the iWARP
/// fallback): our IRD is the smaller of what we offer and the peer's ORD,
/// our ORD the smaller of what we offer and the peer's IRD. The accepting
/// side applies it to the request, the connecting side to the reply.
pub(super) fn negotiate_over_cm(offered: (u32, u32), peer_ird: u8, peer_ord: u8) -> (u32, u32) {
    (
        offered.0.min(peer_ord as u32),
        offered.1.min(peer_ird as u32),
    )
}

fn repr(offered: (u32, u32)) -> IrdOrdRepr {
    IrdOrdRepr {
        ird: offered.0,
        ord: offered.1,
    }
}

/// Connecting side: the private data of `rdma_connect`. With the header
/// ([MS-SMBD] 6.1), our offered (IRD, ORD) big-endian, then the caller's
/// bytes; over the CM, the caller's bytes alone.
pub(super) fn connect_private_data(
    carrier: Carrier,
    offered: (u32, u32),
    caller: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(carrier.header_len() + caller.len());
    if carrier == Carrier::PrivateDataHeader {
        out.extend_from_slice(&repr(offered).to_bytes());
    }
    out.extend_from_slice(caller);
    out
}

/// Accepting side: splits a connection request's private data into the
/// peer's IRD/ORD header (6.2: "at the beginning of any private data") and
/// what the peer's upper layer sent, which is all the caller sees.
///
/// Over the CM there is no header. On iWARP, a request with fewer than 8
/// bytes carries none (a peer that relies on MPA's own negotiation, or none
/// at all): the caller gets those bytes unchanged and [`plan_accept`] falls
/// back to the CM's values.
pub(super) fn split_request(carrier: Carrier, private_data: &[u8]) -> (Option<IrdOrdRepr>, &[u8]) {
    if carrier == Carrier::Cm {
        return (None, private_data);
    }
    match IrdOrdHeader::new_checked(private_data) {
        Ok(view) => (Some(IrdOrdRepr::parse(&view)), &private_data[HEADER_LEN..]),
        Err(_) => (None, private_data),
    }
}

/// What the accepting side sets before `rdma_accept`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AcceptPlan {
    /// Our IRD (`responder_resources`).
    pub ird: u32,
    /// Our ORD (`initiator_depth`).
    pub ord: u32,
    /// The header to put first in the accept's private data: present exactly
    /// when the request carried one (6.2, "if present").
    pub header: Option<IrdOrdRepr>,
}

impl AcceptPlan {
    /// The accept's private data: the header (if any), then the caller's.
    pub fn private_data(&self, caller: &[u8]) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEADER_LEN + caller.len());
        if let Some(h) = self.header {
            out.extend_from_slice(&h.to_bytes());
        }
        out.extend_from_slice(caller);
        out
    }
}

/// Accepting side: our IRD/ORD and the reply's header.
///
/// With the peer's header ([MS-SMBD] 6.2): the reply is
/// [`negotiate_ird_ord`]`(offered, peer)` and we take its mirror (module
/// documentation); a zero result is an error, on which the caller rejects
/// the request instead of accepting it.
///
/// Without it (InfiniBand and RoCE; an iWARP request shorter than 8 bytes):
/// the CM's values of the request (`cm_peer` = the peer's (IRD, ORD) as the
/// CM reports them) through [`negotiate_over_cm`], no header, no rejection
/// (on InfiniBand and RoCE, unchanged). On iWARP the CM's values are whatever
/// the provider's MPA negotiated, or its defaults: the best we have.
pub(super) fn plan_accept(
    offered: (u32, u32),
    cm_peer: (u8, u8),
    peer_header: Option<IrdOrdRepr>,
) -> Result<AcceptPlan, IrdOrdError> {
    let Some(peer) = peer_header else {
        let (ird, ord) = negotiate_over_cm(offered, cm_peer.0, cm_peer.1);
        return Ok(AcceptPlan {
            ird,
            ord,
            header: None,
        });
    };
    let reply = negotiate_ird_ord(repr(offered), peer)?;
    Ok(AcceptPlan {
        ird: reply.ord,
        ord: reply.ird,
        header: Some(reply),
    })
}

/// What the connecting side learns from the accept (the ESTABLISHED event).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Established<'a> {
    /// Our negotiated IRD.
    pub ird: u32,
    /// Our negotiated ORD.
    pub ord: u32,
    /// The acceptor's upper-layer private data (after the header, if any).
    pub private_data: &'a [u8],
}

/// Connecting side: our IRD/ORD from the accept.
///
/// With the acceptor's header (iWARP, 8 bytes or more): 6.2 sets the
/// connecting peer's IRD and ORD "to the same values as transmitted by the
/// accepting peer"; clamped to what we offered, since our queue pair was
/// set up with that (a conforming reply never exceeds it). 6.1 requires
/// both values to be greater than zero: a zero is an error, and the caller
/// fails the connection.
///
/// Without it: over the CM, the CM's values (unchanged from before). On
/// iWARP, an accept shorter than 8 bytes carries no header (the acceptor did
/// not see ours, or does not do Appendix A): fall back to the CM's values,
/// as the accepting side does.
pub(super) fn complete_connect(
    carrier: Carrier,
    offered: (u32, u32),
    cm_peer: (u8, u8),
    reply: &[u8],
) -> Result<Established<'_>, IrdOrdError> {
    let (header, rest) = split_request(carrier, reply);
    let Some(h) = header else {
        let (ird, ord) = negotiate_over_cm(offered, cm_peer.0, cm_peer.1);
        return Ok(Established {
            ird,
            ord,
            private_data: reply,
        });
    };
    if h.ird == 0 {
        return Err(IrdOrdError::ZeroIrd);
    }
    if h.ord == 0 {
        return Err(IrdOrdError::ZeroOrd);
    }
    Ok(Established {
        ird: h.ird.min(offered.0),
        ord: h.ord.min(offered.1),
        private_data: rest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const IWARP: Carrier = Carrier::PrivateDataHeader;

    fn hdr(ird: u32, ord: u32) -> IrdOrdRepr {
        IrdOrdRepr { ird, ord }
    }

    #[test]
    fn only_iwarp_carries_the_header() {
        assert_eq!(Carrier::of(Transport::Iwarp), IWARP);
        assert_eq!(Carrier::of(Transport::InfiniBand), Carrier::Cm);
        assert_eq!(Carrier::of(Transport::Other(4)), Carrier::Cm);
        assert_eq!(IWARP.header_len(), 8);
        assert_eq!(Carrier::Cm.header_len(), 0);
    }

    #[test]
    fn ird_ord_negotiation_takes_the_smaller_of_offer_and_peer_per_appendix_a() {
        // We offer IRD 16, ORD 8; the peer offers IRD 4, ORD 32.
        assert_eq!(negotiate_over_cm((16, 8), 4, 32), (16, 4));
        assert_eq!(negotiate_over_cm((16, 8), 255, 1), (1, 8));
        // A peer that does no RDMA Read leaves our IRD at zero.
        assert_eq!(negotiate_over_cm((16, 8), 4, 0), (0, 4));
        // The conformance suite's case: server (8, 4), client (2, 16).
        assert_eq!(negotiate_over_cm((8, 4), 2, 16), (8, 2));
        assert_eq!(negotiate_over_cm((2, 16), 8, 2), (2, 8));
    }

    #[test]
    fn ird_ord_offer_is_clamped_to_device_and_cm_field() {
        let caps = QpCaps {
            ird: 1000,
            ord: 3,
            ..QpCaps::default()
        };
        assert_eq!(offered_ird_ord(&caps, 128, 128), (128, 3));
        assert_eq!(offered_ird_ord(&caps, 4096, 4096), (255, 3));
    }

    #[test]
    fn iwarp_connect_private_data_starts_with_our_offer_big_endian() {
        let pd = connect_private_data(IWARP, (16, 8), b"hello-req");
        assert_eq!(&pd[..8], &[0, 0, 0, 16, 0, 0, 0, 8]);
        assert_eq!(&pd[8..], b"hello-req");
        assert_eq!(
            connect_private_data(IWARP, (2, 1), &[]),
            [0, 0, 0, 2, 0, 0, 0, 1]
        );
    }

    #[test]
    fn infiniband_and_roce_private_data_is_the_callers_alone() {
        assert_eq!(connect_private_data(Carrier::Cm, (16, 8), b"req"), b"req");
        assert!(connect_private_data(Carrier::Cm, (16, 8), &[]).is_empty());
        let (h, rest) = split_request(Carrier::Cm, &[0, 0, 0, 16, 0, 0, 0, 8, 1]);
        assert_eq!(h, None, "no header is looked for over the CM");
        assert_eq!(rest, &[0, 0, 0, 16, 0, 0, 0, 8, 1]);
    }

    #[test]
    fn accepting_side_strips_the_header_from_the_callers_private_data() {
        let pd = connect_private_data(IWARP, (2, 16), b"hello-req");
        let (h, rest) = split_request(IWARP, &pd);
        assert_eq!(h, Some(hdr(2, 16)));
        assert_eq!(rest, b"hello-req");
        // Exactly the header (what cifs and an SMB Direct client send).
        let (h, rest) = split_request(IWARP, &[0, 0, 0, 4, 0, 0, 1, 0]);
        assert_eq!(h, Some(hdr(4, 256)), "big-endian, full 32 bits");
        assert!(rest.is_empty());
    }

    #[test]
    fn iwarp_request_without_a_header_falls_back_to_the_cm_values() {
        for short in [&[][..], &[0, 0, 0, 4, 0, 0, 0][..]] {
            let (h, rest) = split_request(IWARP, short);
            assert_eq!(h, None);
            assert_eq!(rest, short, "the caller gets the bytes unchanged");
            let plan = plan_accept((8, 4), (2, 16), h).expect("no rejection");
            assert_eq!((plan.ird, plan.ord, plan.header), (8, 2, None));
            assert_eq!(plan.private_data(b"rep"), b"rep", "no header in the reply");
        }
    }

    #[test]
    fn accept_reply_is_the_6_2_negotiation_and_we_take_its_mirror() {
        // Server offers IRD 8, ORD 4; client's header says IRD 2, ORD 16.
        // The CM's fields are deliberately different: the header wins.
        let plan = plan_accept((8, 4), (99, 99), Some(hdr(2, 16))).expect("accept");
        // 6.2: IRD = min(our ORD 4, peer IRD 2), ORD = min(our IRD 8, peer ORD 16).
        assert_eq!(plan.header, Some(hdr(2, 8)));
        // Our ORD never exceeds the client's IRD, our IRD its ORD: the same
        // values as over the CM (conformance case: server (8, 2)).
        assert_eq!((plan.ird, plan.ord), (8, 2));
        let pd = plan.private_data(b"hello-rep");
        assert_eq!(&pd[..8], &[0, 0, 0, 2, 0, 0, 0, 8]);
        assert_eq!(&pd[8..], b"hello-rep");
    }

    #[test]
    fn zero_negotiated_ird_or_ord_rejects_the_request() {
        // Peer IRD 0: reply IRD = min(our ORD, 0) = 0.
        assert_eq!(
            plan_accept((8, 4), (2, 16), Some(hdr(0, 16))),
            Err(IrdOrdError::ZeroIrd)
        );
        // Peer ORD 0.
        assert_eq!(
            plan_accept((8, 4), (2, 16), Some(hdr(2, 0))),
            Err(IrdOrdError::ZeroOrd)
        );
        // Our own offer of zero (a device without RDMA Read resources).
        assert_eq!(
            plan_accept((0, 4), (2, 16), Some(hdr(2, 16))),
            Err(IrdOrdError::ZeroOrd)
        );
        assert_eq!(
            plan_accept((8, 0), (2, 16), Some(hdr(2, 16))),
            Err(IrdOrdError::ZeroIrd)
        );
        // Over the CM a zero stays accepted, as before.
        assert_eq!(
            plan_accept((8, 4), (0, 16), None),
            Ok(AcceptPlan {
                ird: 8,
                ord: 0,
                header: None
            })
        );
    }

    #[test]
    fn connecting_side_adopts_the_accepts_header_and_strips_it() {
        let accept = plan_accept((8, 4), (0, 0), Some(hdr(2, 16)))
            .expect("accept")
            .private_data(b"hello-rep");
        let e = complete_connect(IWARP, (2, 16), (99, 99), &accept).expect("established");
        assert_eq!((e.ird, e.ord), (2, 8), "conformance case: client (2, 8)");
        assert_eq!(e.private_data, b"hello-rep");
    }

    #[test]
    fn both_ends_agree_on_every_transport() {
        let offers = [(8, 4), (2, 16), (16, 16), (1, 255), (255, 1), (3, 3)];
        for server in offers {
            for client in offers {
                // Over the CM: each side bounds by the other's offer.
                let cm_server = negotiate_over_cm(server, client.0 as u8, client.1 as u8);
                let cm_client = negotiate_over_cm(client, server.0 as u8, server.1 as u8);
                // With the header.
                let req = connect_private_data(IWARP, client, &[]);
                let (h, _) = split_request(IWARP, &req);
                let plan = plan_accept(server, (0, 0), h).expect("no zero offer");
                let accept = plan.private_data(&[]);
                let e = complete_connect(IWARP, client, (0, 0), &accept).expect("established");
                assert_eq!((plan.ird, plan.ord), cm_server, "{server:?} {client:?}");
                assert_eq!((e.ird, e.ord), cm_client, "{server:?} {client:?}");
                // Neither issues more RDMA Reads than the other accepts.
                assert!(plan.ord <= e.ird && e.ord <= plan.ird);
            }
        }
    }

    #[test]
    fn accept_header_is_clamped_to_our_offer() {
        let reply = hdr(200, 100).to_bytes();
        let e = complete_connect(IWARP, (16, 8), (0, 0), &reply).expect("established");
        assert_eq!((e.ird, e.ord), (16, 8));
    }

    #[test]
    fn zero_in_the_accepts_header_fails_the_connect() {
        let reply = hdr(0, 4).to_bytes();
        let e = complete_connect(IWARP, (16, 8), (16, 8), &reply);
        assert_eq!(e, Err(IrdOrdError::ZeroIrd));
        let reply = hdr(4, 0).to_bytes();
        let e = complete_connect(IWARP, (16, 8), (16, 8), &reply);
        assert_eq!(e, Err(IrdOrdError::ZeroOrd));
    }

    #[test]
    fn iwarp_accept_without_a_header_falls_back_to_the_cm_values() {
        // An acceptor that sent no (or a short) private data.
        for reply in [&[][..], &[1, 2, 3][..]] {
            let e = complete_connect(IWARP, (2, 16), (8, 4), reply).expect("established");
            // CM: our IRD = min(2, peer ORD 4), our ORD = min(16, peer IRD 8).
            assert_eq!((e.ird, e.ord), (2, 8));
            assert_eq!(e.private_data, reply);
        }
    }

    #[test]
    fn infiniband_and_roce_accepts_keep_their_private_data_and_cm_values() {
        // InfiniBand pads the REP's private data with zeros: never a header.
        let mut reply = b"hello-rep".to_vec();
        reply.resize(196, 0);
        let e = complete_connect(Carrier::Cm, (2, 16), (8, 4), &reply).expect("established");
        assert_eq!((e.ird, e.ord), (2, 8));
        assert_eq!(e.private_data, &reply[..]);
        // And a zero stays accepted, as before.
        let e = complete_connect(Carrier::Cm, (2, 16), (0, 4), &reply).expect("established");
        assert_eq!((e.ird, e.ord), (2, 0));
    }
}
