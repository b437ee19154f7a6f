"""What runs inside each rank of the built-in job: the worker, the model, its parallelisms, the training
loop and the inference engine."""
