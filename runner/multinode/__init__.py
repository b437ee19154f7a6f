"""Many nodes: the options and the rendezvous key (``nodes``), the head's view of the other nodes
(``fleet``), and a node that streams its ranks' events to the head (``relay``)."""
