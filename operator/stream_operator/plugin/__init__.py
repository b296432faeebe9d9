"""``kubectl dstream``: a kubectl plugin for DurableStreams, as ``kubectl cnpg`` is for
CloudNativePG clusters (docs/kubernetes.md, "The kubectl plugin").

kubectl runs any ``kubectl-<name>`` on the PATH for ``kubectl <name>``; pip installs
this package's console script ``kubectl-dstream``. The plugin reads what the operator
and the servers wrote (the DurableStream's status and Events, the Lease, the pods) and
asks for changes only by annotating the DurableStream, as a user with ``kubectl
annotate`` would: the operator carries them out. One exception: ``restart --pod``
deletes that pod, as ``kubectl delete pod`` would. It talks to the API server only
(through the official client), never to the operator.

Modules: ``cli`` (arguments, exit statuses), ``connect`` (kubeconfig, context,
namespace), ``report`` (the status report, pure), ``fencing`` (the fenced-instances
list, pure), ``commands`` (the API reads and writes of each subcommand), ``restart``,
``logs`` and ``bundle`` (``report``'s support bundle).
"""

from stream_operator import GROUP
from stream_operator.decisions.rollout import SWITCHOVER_TO

# The annotations users write on a DurableStream (docs/kubernetes.md); the operator
# acts on them.
__all__ = ["FENCED", "FENCE_ALL", "HIBERNATION", "RECONCILE", "SWITCHOVER_TO", "PluginError"]
HIBERNATION = f"{GROUP}/hibernation"  # "on" | "off"
FENCED = f"{GROUP}/fenced-instances"  # a JSON list of pod names, ["*"] for all
RECONCILE = f"{GROUP}/reconcile"  # "paused"
FENCE_ALL = "*"


class PluginError(Exception):
    """What the user is told on stderr before the plugin exits with status 1."""
