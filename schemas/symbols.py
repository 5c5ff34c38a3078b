"""The second-stage id layout (SPEC section 1), shared by tokenizer, shards and model.

Ids 0..255 are raw bytes, then three markers, then learned merges in the order
they were learned: merge k (0-based) gets id `FIRST_MERGE_ID + k`.
"""

NUM_BYTES = 256
EOP = 256  # end of patch: closes every patch, so patches are self-delimiting
PAD = 257  # fills a patch row up to S symbols; never predicted, ignored by the loss
EOD = 258  # document boundary: one patch [EOD, PAD, ...] after every document
FIRST_MERGE_ID = 259

# In the int32 `tokens` shard column, the two non-text patches get negative ids so
# the column stays aligned 1:1 with `patches` and any first-stage id stays valid.
TOKEN_EOD = -1
TOKEN_PAD = -2

ID_LAYOUT = {"bytes": [0, 255], "eop": EOP, "pad": PAD, "eod": EOD, "first_merge": FIRST_MERGE_ID}
