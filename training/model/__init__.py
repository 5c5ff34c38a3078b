"""The model: layers, local encoder/decoder (local_models.py), patch I/O per scheme (patch_io.py), the patch LM
(patch_lm.py), the entropy model as a wrapper of an already-loaded byte model (entropy_model.py), FLOPs
(flops.py) and the device to run on (devices.py). Plain torch: no Composer, no file I/O."""
