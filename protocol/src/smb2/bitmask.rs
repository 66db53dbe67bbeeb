//! `bitmask!`: a transparent newtype over an integer flags field with named
//! flag constants, set operations and a Debug that lists the names set (and
//! any bits the specification does not define).

macro_rules! bitmask {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($int:ty) {
            $( $(#[$fmeta:meta])* $flag:ident = $val:expr; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub $int);

        #[allow(dead_code)]
        impl $name {
            $( $(#[$fmeta])* pub const $flag: $name = $name($val); )*
            /// Every flag this type names.
            pub const ALL_DEFINED: $name = $name(0 $(| $val)*);
            /// No flag set.
            pub const fn empty() -> $name {
                $name(0)
            }
            /// From the wire value (undefined bits are kept).
            pub const fn from_bits(bits: $int) -> $name {
                $name(bits)
            }
            /// The wire value.
            pub const fn bits(self) -> $int {
                self.0
            }
            /// True when every bit of `other` is set.
            pub const fn contains(self, other: $name) -> bool {
                self.0 & other.0 == other.0
            }
            /// True when any bit of `other` is set.
            pub const fn intersects(self, other: $name) -> bool {
                self.0 & other.0 != 0
            }
            /// `self` with the bits of `other` set.
            pub const fn with(self, other: $name) -> $name {
                $name(self.0 | other.0)
            }
            /// `self` with the bits of `other` cleared.
            pub const fn without(self, other: $name) -> $name {
                $name(self.0 & !other.0)
            }
            /// True when no bit is set.
            pub const fn is_empty(self) -> bool {
                self.0 == 0
            }
            /// Bits set that this type does not name.
            pub const fn undefined_bits(self) -> $int {
                self.0 & !Self::ALL_DEFINED.0
            }
        }

        impl core::ops::BitOr for $name {
            type Output = $name;
            fn bitor(self, rhs: $name) -> $name {
                $name(self.0 | rhs.0)
            }
        }

        impl core::ops::BitOrAssign for $name {
            fn bitor_assign(&mut self, rhs: $name) {
                self.0 |= rhs.0;
            }
        }

        impl core::ops::BitAnd for $name {
            type Output = $name;
            fn bitand(self, rhs: $name) -> $name {
                $name(self.0 & rhs.0)
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                write!(f, "{}({:#x}", stringify!($name), self.0)?;
                let mut sep = ": ";
                $(
                    if !$name::$flag.is_empty() && self.contains($name::$flag) {
                        write!(f, "{sep}{}", stringify!($flag))?;
                        sep = " | ";
                    }
                )*
                let undefined = self.undefined_bits();
                if undefined != 0 {
                    write!(f, "{sep}undefined {undefined:#x}")?;
                }
                f.write_str(")")
            }
        }

        impl $crate::smb2::Scalar for $name {
            #[inline]
            fn read(b: &[u8], f: $crate::smb2::Field) -> Self {
                $name(<$int as $crate::smb2::Scalar>::read(b, f))
            }
            #[inline]
            fn write(self, b: &mut [u8], f: $crate::smb2::Field) {
                <$int as $crate::smb2::Scalar>::write(self.0, b, f)
            }
        }
    };
}

/// `wire_enum!`: a transparent newtype over an integer field whose values
/// the specification enumerates (not flags): named constants, `is_defined`
/// and a Debug that prints the name.
macro_rules! wire_enum {
    (
        $(#[$meta:meta])*
        pub struct $name:ident($int:ty) {
            $( $(#[$fmeta:meta])* $val_name:ident = $val:literal; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
        pub struct $name(pub $int);

        #[allow(dead_code)]
        impl $name {
            $( $(#[$fmeta])* pub const $val_name: $name = $name($val); )*
            /// True for the values the specification defines.
            pub const fn is_defined(self) -> bool {
                self.name().is_some()
            }
            /// The symbolic name, if defined.
            pub const fn name(self) -> Option<&'static str> {
                match self.0 {
                    $( $val => Some(stringify!($val_name)), )*
                    _ => None,
                }
            }
        }

        impl core::fmt::Debug for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                match self.name() {
                    Some(n) => write!(f, "{}::{}", stringify!($name), n),
                    None => write!(f, "{}({:#x})", stringify!($name), self.0),
                }
            }
        }

        impl $crate::smb2::Scalar for $name {
            #[inline]
            fn read(b: &[u8], f: $crate::smb2::Field) -> Self {
                $name(<$int as $crate::smb2::Scalar>::read(b, f))
            }
            #[inline]
            fn write(self, b: &mut [u8], f: $crate::smb2::Field) {
                <$int as $crate::smb2::Scalar>::write(self.0, b, f)
            }
        }
    };
}

#[cfg(test)]
mod tests {
    bitmask! {
        /// Test flags.
        pub struct TestFlags(u16) {
            /// A.
            A = 0x0001;
            /// B.
            B = 0x0004;
        }
    }

    wire_enum! {
        /// Test values.
        pub struct TestValue(u8) {
            /// One.
            ONE = 1;
            /// Three.
            THREE = 3;
        }
    }

    #[test]
    fn bitmask_set_operations_and_undefined_bits() {
        let f = TestFlags::A | TestFlags::from_bits(0x8000);
        assert!(f.contains(TestFlags::A) && !f.contains(TestFlags::B));
        assert!(f.intersects(TestFlags::A | TestFlags::B));
        assert_eq!(f.undefined_bits(), 0x8000);
        assert_eq!(f.without(TestFlags::A).bits(), 0x8000);
        assert_eq!(TestFlags::ALL_DEFINED.bits(), 0x0005);
        assert_eq!(format!("{f:?}"), "TestFlags(0x8001: A | undefined 0x8000)");
        assert_eq!(format!("{:?}", TestFlags::empty()), "TestFlags(0x0)");
    }

    #[test]
    fn wire_enum_names_defined_values_only() {
        assert!(TestValue::THREE.is_defined());
        assert!(!TestValue(2).is_defined());
        assert_eq!(format!("{:?}", TestValue::ONE), "TestValue::ONE");
        assert_eq!(format!("{:?}", TestValue(2)), "TestValue(0x2)");
    }
}
