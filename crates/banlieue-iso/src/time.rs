use crate::{Error, Result};

/// The one instant an image records everywhere: volume creation and modification, and every
/// directory record. Always UTC (offset zero), with whole-second resolution.
///
/// A fixed timestamp is what makes images reproducible; [`Timestamp::UNIX_EPOCH`] is the
/// default so that two builds of the same input agree unless the caller asks otherwise.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    unix_seconds: i64,
}

/// Broken-down UTC time in the ranges ISO 9660 stores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Civil {
    pub year: i64,
    pub month: u8,
    pub day: u8,
    pub hour: u8,
    pub minute: u8,
    pub second: u8,
}

/// 1900-01-01T00:00:00Z: the earliest a directory record's one-byte year can say.
const EARLIEST: i64 = -2_208_988_800;
/// 2155-12-31T23:59:59Z: the latest.
const LATEST: i64 = 5_869_583_999;

impl Timestamp {
    /// 1970-01-01T00:00:00Z.
    pub const UNIX_EPOCH: Timestamp = Timestamp { unix_seconds: 0 };

    /// A timestamp from seconds since the Unix epoch; refuses instants outside 1900..=2155,
    /// the years a directory record can hold.
    pub fn from_unix_seconds(unix_seconds: i64) -> Result<Self> {
        if (EARLIEST..=LATEST).contains(&unix_seconds) {
            Ok(Timestamp { unix_seconds })
        } else {
            Err(Error::TimestampOutOfRange { unix_seconds })
        }
    }

    /// The current time, truncated to the second.
    pub fn now() -> Self {
        let unix_seconds = match std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)
        {
            Ok(since) => i64::try_from(since.as_secs()).unwrap_or(LATEST),
            // A clock before 1970 is broken; the epoch is as good an answer as any.
            Err(_) => 0,
        };
        Timestamp {
            unix_seconds: unix_seconds.clamp(EARLIEST, LATEST),
        }
    }

    /// Seconds since the Unix epoch.
    pub fn unix_seconds(self) -> i64 {
        self.unix_seconds
    }

    pub(crate) fn civil(self) -> Civil {
        let days = self.unix_seconds.div_euclid(86_400);
        let secs_of_day = self.unix_seconds.rem_euclid(86_400);
        let (year, month, day) = civil_from_days(days);
        // Every component is in range by construction: the day splits into 24 × 60 × 60.
        Civil {
            year,
            month,
            day,
            hour: (secs_of_day / 3600) as u8,
            minute: (secs_of_day / 60 % 60) as u8,
            second: (secs_of_day % 60) as u8,
        }
    }

    /// The 7-byte form of ECMA-119 §9.1.5 used in directory records.
    pub(crate) fn directory_record_form(self) -> [u8; 7] {
        let c = self.civil();
        // The constructor keeps the year within 1900..=2155.
        let years_since_1900 = (c.year - 1900) as u8;
        [
            years_since_1900,
            c.month,
            c.day,
            c.hour,
            c.minute,
            c.second,
            0,
        ]
    }

    /// The 17-byte form of ECMA-119 §8.4.26.1 used in volume descriptors.
    pub(crate) fn volume_descriptor_form(self) -> [u8; 17] {
        let c = self.civil();
        let digits = format!(
            "{:04}{:02}{:02}{:02}{:02}{:02}00",
            c.year, c.month, c.day, c.hour, c.minute, c.second
        );
        let mut out = [0u8; 17];
        out[..16].copy_from_slice(&digits.as_bytes()[..16]);
        // Byte 16 is the offset from UTC in 15-minute units: zero.
        out
    }
}

impl Default for Timestamp {
    fn default() -> Self {
        Timestamp::UNIX_EPOCH
    }
}

/// "Not specified" for the expiration and effective dates: sixteen ASCII zeros and offset 0.
pub(crate) const UNSPECIFIED_VOLUME_DATE: [u8; 17] = *b"0000000000000000\0";

/// Proleptic Gregorian date from days since 1970-01-01, by counting 400-year eras that start
/// on 1 March so the leap day falls at the end of each year.
fn civil_from_days(days: i64) -> (i64, u8, u8) {
    let shifted = days + 719_468;
    let era = shifted.div_euclid(146_097);
    let day_of_era = shifted.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_from_march = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * month_from_march + 2) / 5 + 1) as u8;
    let month = if month_from_march < 10 {
        month_from_march + 3
    } else {
        month_from_march - 9
    } as u8;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        let t = Timestamp::from_unix_seconds(1_704_164_645).unwrap();
        assert_eq!(&t.volume_descriptor_form()[..16], b"2024010203040500");
        assert_eq!(t.directory_record_form(), [124, 1, 2, 3, 4, 5, 0]);
        let leap = Timestamp::from_unix_seconds(951_782_400).unwrap();
        assert_eq!(&leap.volume_descriptor_form()[..8], b"20000229");
        let early = Timestamp::from_unix_seconds(EARLIEST).unwrap();
        assert_eq!(early.directory_record_form(), [0, 1, 1, 0, 0, 0, 0]);
        let late = Timestamp::from_unix_seconds(LATEST).unwrap();
        assert_eq!(late.directory_record_form(), [255, 12, 31, 23, 59, 59, 0]);
    }

    #[test]
    fn refuses_years_a_record_cannot_hold() {
        assert!(Timestamp::from_unix_seconds(EARLIEST - 1).is_err());
        assert!(Timestamp::from_unix_seconds(LATEST + 1).is_err());
    }
}
