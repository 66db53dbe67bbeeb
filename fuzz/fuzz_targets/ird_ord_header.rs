//! [MS-SMBD] Appendix A IRD/ORD negotiate header: never panics; decodes
//! (big-endian) exactly when 8 bytes are present and re-emits to them; the
//! 6.2 negotiation of the first header against a second one (the next 8
//! bytes) never panics, refuses exactly a zero result, and never grants more
//! than either side offered.
#![no_main]

use libfuzzer_sys::fuzz_target;
use smbdirect_protocol::smbd::wire::{negotiate_ird_ord, IrdOrdHeader, IrdOrdRepr};
use smbdirect_protocol::WireError;

fuzz_target!(|data: &[u8]| {
    let peer = match IrdOrdHeader::new_checked(data) {
        Ok(view) => {
            let r = IrdOrdRepr::parse(&view);
            assert_eq!(
                r.ird,
                u32::from_be_bytes([data[0], data[1], data[2], data[3]])
            );
            assert_eq!(
                r.ord,
                u32::from_be_bytes([data[4], data[5], data[6], data[7]])
            );
            assert_eq!(&r.to_bytes()[..], &data[..8]);
            r
        }
        Err(WireError::Truncated { need, have, .. }) => {
            assert_eq!((need, have), (8, data.len()));
            return;
        }
        Err(e) => panic!("unexpected verdict {e:?}"),
    };
    let Ok(view) = IrdOrdHeader::new_checked(&data[8..]) else {
        return;
    };
    let local = IrdOrdRepr::parse(&view);
    let ird = local.ord.min(peer.ird);
    let ord = local.ird.min(peer.ord);
    match negotiate_ird_ord(local, peer) {
        Ok(r) => {
            assert!(ird > 0 && ord > 0);
            assert_eq!(r, IrdOrdRepr { ird, ord });
        }
        Err(_) => assert!(ird == 0 || ord == 0),
    }
});
