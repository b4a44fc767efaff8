"""Config of pod discovery beside the static `endpoints:` list.

`discovery.kubernetes` watches the pods of a namespace that match a label selector, as an
InferencePool names them (`selector`, `targetPort`): a pod is an endpoint while it is Running
and Ready, at `http://<pod IP>:<targetPort>`, named by its pod name and carrying its labels
(so the role and context-length filters read them). See datalayer/kubernetes.py."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from heimdall_proxy.framework.params import Duration


class KubernetesDiscoveryConfig(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    #: The namespace watched; empty: every namespace the credentials may list.
    namespace: str = ""
    #: matchLabels of the InferencePool: every label must match.
    selector: dict[str, str]
    target_port: int = Field(alias="targetPort", gt=0, lt=65536)
    scheme: str = Field(default="http", pattern="^https?$")
    #: A kubeconfig file; none: the in-cluster service account, else ~/.kube/config.
    kubeconfig: str | None = None
    context: str | None = None
    #: A watch is reopened (from the last resource version) after this long, as client-go's
    #: reflector does, so a silently dead connection is noticed.
    watch_timeout: Duration = Field(default=300.0, alias="watchTimeout")
    #: The wait before listing again after the API server failed.
    retry_delay: Duration = Field(default=2.0, alias="retryDelay")

    @field_validator("selector")
    @classmethod
    def _selector(cls, value: dict[str, str]) -> dict[str, str]:
        if not value:
            raise ValueError("an empty selector would take every pod of the namespace")
        return {str(k): str(v) for k, v in value.items()}

    def label_selector(self) -> str:
        """The selector as the API's `labelSelector` query parameter."""
        return ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))


class DiscoveryConfig(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")

    kubernetes: KubernetesDiscoveryConfig | None = None
