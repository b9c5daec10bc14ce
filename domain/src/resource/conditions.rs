//! Setting `status.conditions` the Kubernetes way: `lastTransitionTime`
//! moves only when the condition's status flips.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Sets condition `type_` to `status` with `reason`/`message`.
pub fn set_condition(
    conditions: &mut Vec<Condition>,
    type_: &str,
    status: bool,
    reason: &str,
    message: &str,
    observed_generation: Option<i64>,
    now: Time,
) {
    let status = if status { "True" } else { "False" }.to_owned();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            if existing.status != status {
                existing.last_transition_time = now;
            }
            existing.status = status;
            existing.reason = reason.to_owned();
            existing.message = message.to_owned();
            existing.observed_generation = observed_generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message: message.to_owned(),
            observed_generation,
            last_transition_time: now,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).unwrap())
    }

    #[test]
    fn transition_time_moves_only_on_a_flip() {
        let mut c = Vec::new();
        set_condition(&mut c, "Ready", false, "Provisioning", "", Some(1), at(10));
        set_condition(&mut c, "Ready", false, "Provisioning", "still", Some(1), at(20));
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].last_transition_time, at(10));
        assert_eq!(c[0].message, "still");
        set_condition(&mut c, "Ready", true, "Healthy", "", Some(2), at(30));
        assert_eq!(c[0].last_transition_time, at(30));
        assert_eq!(
            (c[0].status.as_str(), c[0].observed_generation),
            ("True", Some(2))
        );
    }
}
