"""Many nodes: the options and the rendezvous key (``nodes``) and the head's view of the other nodes (``fleet``);
a node streams its ranks' events to the head from its session (:mod:`meshtop.runner.session.relay`)."""
