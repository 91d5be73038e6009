//! The provider's part of the attested handover (ADR-0077), the same for every backend that
//! relays: which challenge is still to be relayed, and what a relay saw. The provider only
//! relays: it checks nothing in the challenge or the answer beyond their bounds, since the
//! subject trusts neither and checks both itself.

use banlieue_api::handover::{Attestation, HandoverAnswer, HandoverChallenge};

/// What became of a challenge this reconcile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandoverSight {
    /// The guest answered it (activated and quoted, or said why not).
    Answered(HandoverAnswer),
    /// Not yet, and why: the machine looks again soon.
    Pending(String),
}

/// The challenge to relay: the machine's `spec.handover` unless the recorded answer is
/// already this challenge's (`digest` of its credential).
pub fn to_relay<'a>(
    wanted: Option<&'a HandoverChallenge>,
    recorded: Option<&Attestation>,
) -> Option<&'a HandoverChallenge> {
    let wanted = wanted?;
    let answered = recorded
        .and_then(|a| a.answer.as_ref())
        .map(|answer| answer.challenge.as_str());
    match wanted.digest() {
        Ok(digest) if answered == Some(digest.as_str()) => None,
        _ => Some(wanted),
    }
}

/// The answer a challenge gets without reaching the guest: one whose credential is not
/// base64, or whose extra data is not a digest (the CRD refuses both; a machine written
/// around it still gets a recorded answer rather than a retry for ever).
pub fn unrelayable(challenge: &HandoverChallenge) -> Option<HandoverAnswer> {
    let why = match challenge.activate_line() {
        Ok(_) => return None,
        Err(why) => why,
    };
    Some(HandoverAnswer {
        challenge: challenge.digest().unwrap_or_default(),
        failure: Some(format!("not relayed: {why}")),
        ..HandoverAnswer::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn challenge(credential: &str) -> HandoverChallenge {
        HandoverChallenge {
            credential: credential.into(),
            binding: "0".repeat(64),
            sealed: None,
        }
    }

    #[test]
    fn a_challenge_is_relayed_until_its_answer_is_recorded() {
        let first = challenge("AAAA");
        assert_eq!(to_relay(None, None), None);
        assert_eq!(to_relay(Some(&first), None), Some(&first));
        let answered = Attestation {
            attestation_key: None,
            answer: Some(HandoverAnswer {
                challenge: first.digest().unwrap(),
                ..HandoverAnswer::default()
            }),
        };
        assert_eq!(to_relay(Some(&first), Some(&answered)), None);
        // The subject's next challenge is relayed though the last one was answered.
        let second = challenge("BBBB");
        assert_eq!(to_relay(Some(&second), Some(&answered)), Some(&second));
    }

    #[test]
    fn a_malformed_challenge_is_answered_without_the_guest() {
        assert_eq!(unrelayable(&challenge("AAAA")), None);
        let answer = unrelayable(&challenge("!!")).unwrap();
        assert!(answer.failure.unwrap().contains("not base64"));
    }
}
