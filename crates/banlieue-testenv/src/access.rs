//! What a ServiceAccount may do, asked of the API server's authorizer with a
//! SubjectAccessReview: the question tests of the shipped RBAC ask, without acting as the
//! account.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};

/// One request: `verb` on `resource` (`pods`, or `pods/log` for a subresource) of API group
/// `group`, optionally one object `name`, in `namespace` (`None`: cluster-scoped or all).
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    pub verb: &'a str,
    pub group: &'a str,
    pub resource: &'a str,
    pub name: Option<&'a str>,
    pub namespace: Option<&'a str>,
}

/// Whether the ServiceAccount `user` (`system:serviceaccount:<namespace>:<name>`), with the
/// groups the API server gives it, may make `request`. `admin` asks; the answer is the
/// authorizer's.
pub async fn service_account_may(
    admin: &Client,
    user: &str,
    request: &Request<'_>,
) -> kube::Result<bool> {
    let (resource, subresource) = match request.resource.split_once('/') {
        Some((resource, sub)) => (resource, Some(sub.to_owned())),
        None => (request.resource, None),
    };
    let account_namespace = user.split(':').nth(2).unwrap_or_default();
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            groups: Some(vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{account_namespace}"),
                "system:authenticated".into(),
            ]),
            resource_attributes: Some(ResourceAttributes {
                group: Some(request.group.to_owned()),
                resource: Some(resource.to_owned()),
                subresource,
                name: request.name.map(str::to_owned),
                verb: Some(request.verb.to_owned()),
                namespace: request.namespace.map(str::to_owned),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await?;
    Ok(answer.status.is_some_and(|status| status.allowed))
}
