"""How well an attention's implied operator approximates exact softmax attention: the metrics (`metrics`, pure
fp64 functions shared with the approximation study) and the validation-time callback (`callback`)."""
