"""Reading requests and answers: the request body parsed into an InferenceRequest, answers'
usage, and the fields a client may not set."""
